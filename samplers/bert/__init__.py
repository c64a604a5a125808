"""BERT masked-LM and sentence-order samples (megatron-core's `BERTMaskedWordPieceDataset`)."""
