"""T5 and mT5: `model.py` (the module), `config.py` (shape and special ids from the flags), `parallelize.py`
(tensor-parallel plan), `pipeline.py` and `runner.py` (encoder and decoder stages), `data.py` (collate),
`hf.py` (Hugging Face T5/mT5 names and config), `convert.py` (checkpoints <-> HF), `generate.py`,
`training.py` (data, FLOPs), `spec.py` (what the core asks of the family)."""
