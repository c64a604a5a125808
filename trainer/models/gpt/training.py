"""GPT's part in a training run: its shape from the flags, data, collate and FLOPs per token."""

from __future__ import annotations

from trainer.config import TrainConfig
from trainer.data.batches import resolve_vocabulary
from trainer.models.gpt.data import build_datasets, collate
from trainer.metrics.writers import FORWARD_BACKWARD_FACTOR
from trainer.models.gpt.model import GPTShape
from trainer.models.spec import FamilyLayout, TrainingParts
from trainer.moe.settings import moe_settings
from trainer.parallel.dims import pad_vocab_size


def model_shape(config: TrainConfig, vocab_size: int, tp: int) -> GPTShape:
    """The model's dimensions with the vocabulary padded for ``tp``."""
    m = config.model
    return GPTShape(num_layers=m.num_layers, hidden_size=m.hidden_size, num_attention_heads=m.num_attention_heads,
                    ffn_hidden_size=m.ffn_hidden_size, max_position_embeddings=m.positions(),
                    padded_vocab_size=pad_vocab_size(vocab_size, m.make_vocab_size_divisible_by, tp),
                    hidden_dropout=m.hidden_dropout, attention_dropout=m.attention_dropout,
                    init_method_std=m.init_method_std, layernorm_epsilon=m.layernorm_epsilon,
                    fused_qkv=m.fused_qkv, moe=moe_settings(config.moe))


def layout_rules(config: TrainConfig, tp: int) -> FamilyLayout:
    """Positions and (under sequence parallelism) the sequence split over tp; the pipeline splits the layers."""
    model = config.model
    rules = [(model.positions() >= model.seq_length,
              f"max_position_embeddings ({model.positions()}) is smaller than seq_length ({model.seq_length})"),
             (model.positions() % tp == 0,
              f"max_position_embeddings ({model.positions()}) is not divisible by "
              f"tensor_model_parallel_size ({tp})"),
             (not config.parallelism.sequence_parallel or model.seq_length % tp == 0,
              f"seq_length ({model.seq_length}) is not divisible by tensor_model_parallel_size ({tp}), "
              f"which sequence_parallel needs")]
    return FamilyLayout(rules, model.num_layers, f"num_layers ({model.num_layers})")


def flops_per_token(shape: GPTShape, seq_length: int) -> float:
    """Training FLOPs per token: 3 x (q/k/v/o + MLP + attention-score matmuls + output head), 2 FLOPs per MAC.
    A MoE layer's MLP counts the active experts (top-k of them) and its router."""
    h, ffn = shape.hidden_size, shape.ffn_hidden_size
    mlp = 2 * 2 * h * ffn
    total = 0
    for index in range(shape.num_layers):
        moe = shape.moe is not None and shape.moe.is_moe_layer(index)
        layer_mlp = shape.moe.top_k * mlp + 2 * h * shape.moe.num_experts if moe else mlp
        total += 2 * 4 * h * h + layer_mlp + 2 * 2 * seq_length * h
    return FORWARD_BACKWARD_FACTOR * (total + 2 * h * shape.padded_vocab_size)


def training_parts(config: TrainConfig, tp: int, sizes: tuple[int, int, int]) -> TrainingParts:
    """GPT sequences of ``--seq-length`` tokens from the blend, over the tokenizer's vocabulary."""
    vocabulary = resolve_vocabulary(config.data, config.model.vocab_size)
    shape = model_shape(config, vocabulary.size, tp)
    datasets = build_datasets(config.data, config.model.seq_length, vocabulary, sizes)
    return TrainingParts(vocabulary=vocabulary, shape=shape, datasets=datasets, collate=collate,
                         tokens_per_sample=config.model.seq_length,
                         flops_per_token=flops_per_token(shape, config.model.seq_length))
