"""T5's part in a training run: span-corruption data, its special ids, shape and FLOPs per position."""

from __future__ import annotations

from trainer.config import TrainConfig
from trainer.data.batches import Vocabulary
from trainer.errors import TrainConfigError
from trainer.metrics.writers import FORWARD_BACKWARD_FACTOR
from trainer.family.spec import TrainingParts
from trainer.parallel.plan import FamilyLayout
from trainer.models.t5.config import build_t5_training_datasets, resolve_t5_special_ids, t5_shape
from trainer.models.t5.data import collate_t5
from trainer.models.t5.model import T5Shape
from trainer.models.t5.settings import t5_settings

# A gated-GELU MLP has two input projections.
GATED_INPUTS = 2


def layout_rules(config: TrainConfig, tp: int) -> FamilyLayout:
    """Under sequence parallelism both lengths split over tp; the pipeline splits encoder and decoder blocks
    together. (The vocabulary is padded to a multiple of tp, `pad_vocab_size`, and T5 has no position table: a
    max_position_embeddings given, as CPM-Pretrain's run_t5.sh does, must cover both lengths, Megatron's check.)"""
    model, t5 = config.model, t5_settings(config)
    decoder_layers = t5.decoder_num_layers or model.num_layers
    positions = model.max_position_embeddings
    sequence_parallel = config.parallelism.sequence_parallel
    rules = [(positions is None or positions >= max(t5.encoder_seq_length, t5.decoder_seq_length),
              f"max_position_embeddings ({positions}) is smaller than encoder_seq_length ({t5.encoder_seq_length}) "
              f"or decoder_seq_length ({t5.decoder_seq_length})"),
             *((not sequence_parallel or length % tp == 0,
                f"{name} ({length}) is not divisible by tensor_model_parallel_size ({tp}), which sequence_parallel "
                f"needs") for name, length in (("encoder_seq_length", t5.encoder_seq_length),
                                                ("decoder_seq_length", t5.decoder_seq_length)))]
    cp = config.parallelism.context_parallel_size
    rules.append((cp == 1, f"context_parallel_size ({cp}) > 1 is not implemented for model t5 (decoder models only)"))
    return FamilyLayout(rules, model.num_layers + decoder_layers,
                        f"num_layers + decoder_num_layers ({model.num_layers} + {decoder_layers})")


def flops_per_token(shape: T5Shape, encoder_length: int, decoder_length: int) -> float:
    """Training FLOPs per sample position (encoder + decoder).

    Per sample: encoder blocks (q/k/v/o, MLP, scores over ``encoder_length``) on every encoder
    position; decoder blocks (self-attention, MLP, cross-attention q/o and scores) on every decoder
    position, plus the cross-attention k/v projections of every encoder position; the LM head on
    every decoder position. Gated-GELU MLPs have two input projections; MoE layers count top-k of them.
    """
    d, inner, d_ff = shape.d_model, shape.num_heads * shape.d_kv, shape.d_ff
    mlp = 2 * (GATED_INPUTS if shape.feed_forward == "gated-gelu" else 1) * d * d_ff + 2 * d_ff * d
    projections = 2 * 4 * d * inner
    encoder = shape.num_encoder_layers * encoder_length * (projections + mlp + 2 * 2 * encoder_length * inner)
    decoder_position = (projections + 2 * 2 * decoder_length * inner  # self-attention
                        + 2 * 2 * d * inner + 2 * 2 * encoder_length * inner  # cross-attention q, o and scores
                        + mlp)
    cross_kv = 2 * 2 * d * inner * encoder_length
    decoder = shape.num_decoder_layers * (decoder_length * decoder_position + cross_kv)
    head = 2 * d * shape.vocab_size * decoder_length
    if shape.moe is not None:  # a MoE layer runs top-k experts' MLPs and its router
        expert_mlp = mlp * shape.moe.expert_width(d_ff) / d_ff  # as the dense MLP, moe_ffn_hidden_size wide
        extra = shape.moe.top_k * expert_mlp - mlp + 2 * d * shape.moe.num_experts
        encoder += encoder_length * extra * sum(map(shape.moe.is_moe_layer, range(shape.num_encoder_layers)))
        decoder += decoder_length * extra * sum(map(shape.moe.is_moe_layer, range(shape.num_decoder_layers)))
    return FORWARD_BACKWARD_FACTOR * (encoder + decoder + head) / (encoder_length + decoder_length)


def training_parts(config: TrainConfig, tp: int, sizes: tuple[int, int, int]) -> TrainingParts:
    """Span-corruption samples of one sentence-split dataset; the tokenizer's sentinels, EOS and pad."""
    t5 = t5_settings(config)
    special = resolve_t5_special_ids(config.data, t5.vocab_extra_ids)
    vocabulary = Vocabulary(size=config.model.vocab_size or special.vocab_size, eod_id=special.eos,
                            pad_id=special.pad)
    if special.vocab_size > vocabulary.size:
        raise TrainConfigError(f"the tokenizer {config.data.tokenizer_model or config.data.vocab_file} has "
                               f"{special.vocab_size} ids (with {len(special.sentinels)} sentinels) but the "
                               f"model's vocab_size is {vocabulary.size}: its ids do not fit the model")
    shape = t5_shape(config.model, t5, vocabulary.size, tp, config.moe)
    datasets = build_t5_training_datasets(config.data, t5, special, sizes, config.masking)
    encoder, decoder = t5.encoder_seq_length, t5.decoder_seq_length
    return TrainingParts(vocabulary=vocabulary, shape=shape, datasets=datasets, collate=collate_t5,
                         tokens_per_sample=encoder + decoder, flops_per_token=flops_per_token(shape, encoder, decoder))
