"""GPT's part in a training run: its shape from the flags, data, collate and FLOPs per token."""

from __future__ import annotations

from trainer.config import ModelConfig, TrainConfig
from trainer.data.batches import resolve_vocabulary
from trainer.models.gpt.data import build_datasets, collate
from trainer.metrics.writers import FORWARD_BACKWARD_FACTOR
from trainer.models.gpt.model import GPTShape
from trainer.family.spec import TrainingParts
from trainer.parallel.context import CHUNKS_PER_RANK
from trainer.parallel.plan import FamilyLayout
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
                    fused_qkv=m.fused_qkv, moe=moe_settings(config.moe),
                    **decoder_options(m))


def decoder_options(m: ModelConfig) -> dict[str, object]:
    """The `GPTShape` fields of the Llama-class options (Megatron's flags as megatron-core's TransformerConfig
    takes them)."""
    return {"normalization": m.normalization, "apply_layernorm_1p": m.apply_layernorm_1p, "swiglu": m.swiglu,
            "position_embedding_type": m.position_embedding_type, "rotary_base": m.rotary_base,
            "rotary_percent": m.rotary_percent,
            "rotary_interpolation_factor": (float(m.rotary_seq_len_interpolation_factor)
                                            if m.rotary_seq_len_interpolation_factor is not None else None),
            "rope_scaling_factor": m.rope_scaling_factor if m.use_rope_scaling else None,
            "num_query_groups": m.query_groups() if m.group_query_attention else None,
            "kv_channels": m.kv_channels, "add_bias_linear": not m.disable_bias_linear,
            "add_qkv_bias": m.add_qkv_bias, "qk_layernorm": m.qk_layernorm,
            "untie_embeddings_and_output_weights": m.untie_embeddings_and_output_weights}


def layout_rules(config: TrainConfig, tp: int) -> FamilyLayout:
    """Positions and (under sequence parallelism) the sequence split over tp; the pipeline splits the layers."""
    model = config.model
    rules = [(model.positions() >= model.seq_length,
              f"max_position_embeddings ({model.positions()}) is smaller than seq_length ({model.seq_length})"),
             (model.position_embedding_type != "learned_absolute" or model.positions() % tp == 0,
              f"max_position_embeddings ({model.positions()}) is not divisible by "
              f"tensor_model_parallel_size ({tp})"),
             # Megatron: "num_query_groups must be a multiple of tensor_model_parallel_size".
             (model.query_groups() % tp == 0,
              f"num_query_groups ({model.query_groups()}) is not divisible by tensor_model_parallel_size ({tp})"),
             (not config.parallelism.sequence_parallel or model.seq_length % tp == 0,
              f"seq_length ({model.seq_length}) is not divisible by tensor_model_parallel_size ({tp}), "
              f"which sequence_parallel needs")]
    # A later pipeline stage receives hidden states only: no per-sample mask, and rope from positions 0..seq-1.
    pp = config.parallelism.pipeline_model_parallel_size
    rules += [(not config.data.reset_attention_mask or pp == 1,
               f"reset_attention_mask does not combine with pipeline_model_parallel_size ({pp}) > 1: the later "
               "stages would not receive the per-sample mask"),
              (not config.data.reset_position_ids or pp == 1 or model.position_embedding_type != "rope",
               f"reset_position_ids with position_embedding_type rope does not combine with "
               f"pipeline_model_parallel_size ({pp}) > 1: the later stages would rotate by positions 0..seq-1")]
    # Context parallelism (`trainer.parallel.context`): 2 x cp chunks per sequence, and no per-sample mask (the
    # attention builds the causal mask of the local queries itself).
    cp = config.parallelism.context_parallel_size
    rules += [(model.seq_length % (CHUNKS_PER_RANK * cp) == 0,
               f"seq_length ({model.seq_length}) is not divisible by 2 x context_parallel_size ({cp})"),
              (not config.parallelism.sequence_parallel or model.seq_length // cp % tp == 0,
               f"seq_length ({model.seq_length}) / context_parallel_size ({cp}) is not divisible by "
               f"tensor_model_parallel_size ({tp}), which sequence_parallel needs"),
              (not config.data.reset_attention_mask or cp == 1,
               f"reset_attention_mask does not combine with context_parallel_size ({cp}) > 1 yet")]
    return FamilyLayout(rules, model.num_layers, f"num_layers ({model.num_layers})")


def flops_per_token(shape: GPTShape, seq_length: int) -> float:
    """Training FLOPs per token: 3 x (q/k/v/o + MLP + attention-score matmuls + output head), 2 FLOPs per MAC.
    A MoE layer's MLP counts the active experts (top-k of them) and its router.

    Projections as Megatron's ``num_floating_point_operations``: q and o are H d wide, k and v G d (grouped-query
    attention), a SwiGLU MLP has three h x ffn matmuls where GELU has two. The score and value matmuls count
    the full seq x seq square (this trainer's convention since GPT-2; Megatron halves them for the causal mask).
    """
    h, ffn = shape.hidden_size, shape.ffn_hidden_size
    q_size, kv_size = shape.num_attention_heads * shape.head_dim, shape.query_groups * shape.head_dim
    projections = 2 * h * (2 * q_size + 2 * kv_size)
    mlp = 2 * (3 if shape.swiglu else 2) * h * ffn
    total = 0
    for index in range(shape.num_layers):
        moe = shape.moe is not None and shape.moe.is_moe_layer(index)
        # (an expert's MLP is as the dense one, moe_ffn_hidden_size wide)
        layer_mlp = shape.moe.top_k * mlp * shape.moe.expert_width(ffn) / ffn + 2 * h * shape.moe.num_experts \
            if moe else mlp
        total += projections + layer_mlp + 2 * 2 * seq_length * q_size
    return FORWARD_BACKWARD_FACTOR * (total + 2 * h * shape.padded_vocab_size)


def training_parts(config: TrainConfig, tp: int, sizes: tuple[int, int, int]) -> TrainingParts:
    """GPT sequences of ``--seq-length`` tokens from the blend, over the tokenizer's vocabulary."""
    vocabulary = resolve_vocabulary(config.data, config.model.vocab_size)
    shape = model_shape(config, vocabulary.size, tp)
    datasets = build_datasets(config.data, config.model.seq_length, vocabulary, sizes)
    return TrainingParts(vocabulary=vocabulary, shape=shape, datasets=datasets, collate=collate,
                         tokens_per_sample=config.model.seq_length,
                         flops_per_token=flops_per_token(shape, config.model.seq_length))
