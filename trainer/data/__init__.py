"""Batches for the trainer, any family: vocabulary, data files, data-parallel order, read-ahead."""
