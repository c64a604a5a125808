"""GPT's part in a training run: its shape from the flags, data, collate and FLOPs per token."""

from __future__ import annotations

from trainer.config import TrainConfig
from trainer.data import build_datasets, collate, resolve_vocabulary
from trainer.metrics import FORWARD_BACKWARD_FACTOR
from trainer.models.gpt.model import GPTShape
from trainer.models.spec import TrainingParts
from trainer.parallel_dims import pad_vocab_size



def model_shape(config: TrainConfig, vocab_size: int, tp: int) -> GPTShape:
    """The model's dimensions with the vocabulary padded for ``tp``."""
    m = config.model
    return GPTShape(num_layers=m.num_layers, hidden_size=m.hidden_size, num_attention_heads=m.num_attention_heads,
                    ffn_hidden_size=m.ffn_hidden_size, max_position_embeddings=m.max_position_embeddings,
                    padded_vocab_size=pad_vocab_size(vocab_size, m.make_vocab_size_divisible_by, tp),
                    hidden_dropout=m.hidden_dropout, attention_dropout=m.attention_dropout,
                    init_method_std=m.init_method_std, layernorm_epsilon=m.layernorm_epsilon,
                    fused_qkv=m.fused_qkv)


def flops_per_token(shape: GPTShape, seq_length: int) -> float:
    """Training FLOPs per token: 3 x (q/k/v/o + MLP + attention-score matmuls + output head), 2 FLOPs per MAC."""
    h, ffn = shape.hidden_size, shape.ffn_hidden_size
    per_layer = 2 * (4 * h * h + 2 * h * ffn) + 2 * 2 * seq_length * h
    return FORWARD_BACKWARD_FACTOR * (shape.num_layers * per_layer + 2 * h * shape.padded_vocab_size)


def training_parts(config: TrainConfig, tp: int, sizes: tuple[int, int, int]) -> TrainingParts:
    """GPT sequences of ``--seq-length`` tokens from the blend, over the tokenizer's vocabulary."""
    vocabulary = resolve_vocabulary(config.data, config.model.vocab_size)
    shape = model_shape(config, vocabulary.size, tp)
    datasets = build_datasets(config.data, config.model.seq_length, vocabulary, sizes)
    return TrainingParts(vocabulary=vocabulary, shape=shape, datasets=datasets, collate=collate,
                         tokens_per_sample=config.model.seq_length,
                         flops_per_token=flops_per_token(shape, config.model.seq_length))
