"""Checkpoints: DCP save/load, manifests and checksums, the save directory's lock, what a checkpoint records (tokenizer, lengths, model files), Hugging Face file helpers and conversion dispatch."""
