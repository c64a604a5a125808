"""The GPT sample kind: fixed-length token sequences cut across documents (Megatron's GPTDataset): the
document/sample/shuffle indices (`indices`), the torch Dataset (`dataset`), and the training view
(`inspect`, `view`)."""
