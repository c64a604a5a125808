"""GPT (GPT-2 architecture): `model.py` (the module), `parallelize.py` (tensor-parallel plan),
`fused_qkv.py` (OneFlow's fused q/k/v projection), `hf.py` (Hugging Face GPT-2 names and config),
`training.py` (shape, data, FLOPs), `spec.py` (what the core asks of the family)."""
