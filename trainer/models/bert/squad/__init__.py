"""Extractive question answering (SQuAD v1.1, CMRC 2018) with BERT: features, fine-tuning, n-best decoding,
the official metric, prediction. Commands: ``finetune --task squad`` (`trainer.models.bert.squad.cli`) and ``predict``."""
