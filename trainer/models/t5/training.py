"""T5's part in a training run: span-corruption data, its special ids, shape and FLOPs per position."""

from __future__ import annotations

from trainer.config import TrainConfig
from trainer.data import Vocabulary
from trainer.metrics import FORWARD_BACKWARD_FACTOR
from trainer.models.spec import TrainingParts
from trainer.models.t5.config import build_t5_training_datasets, resolve_t5_special_ids, t5_shape
from trainer.models.t5.data import collate_t5
from trainer.models.t5.model import T5Shape

# A gated-GELU MLP has two input projections.
GATED_INPUTS = 2


def flops_per_token(shape: T5Shape, encoder_length: int, decoder_length: int) -> float:
    """Training FLOPs per sample position (encoder + decoder).

    Per sample: encoder blocks (q/k/v/o, MLP, scores over ``encoder_length``) on every encoder
    position; decoder blocks (self-attention, MLP, cross-attention q/o and scores) on every decoder
    position, plus the cross-attention k/v projections of every encoder position; the LM head on
    every decoder position. Gated-GELU MLPs have two input projections.
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
    return FORWARD_BACKWARD_FACTOR * (encoder + decoder + head) / (encoder_length + decoder_length)


def training_parts(config: TrainConfig, tp: int, sizes: tuple[int, int, int]) -> TrainingParts:
    """Span-corruption samples of one sentence-split dataset; the tokenizer's sentinels, EOS and pad."""
    special = resolve_t5_special_ids(config.data, config.t5.vocab_extra_ids)
    vocabulary = Vocabulary(size=config.model.vocab_size or special.vocab_size, eod_id=special.eos,
                            pad_id=special.pad)
    shape = t5_shape(config.model, config.t5, vocabulary.size, tp)
    datasets = build_t5_training_datasets(config.data, config.t5, special, sizes)
    encoder, decoder = config.t5.encoder_seq_length, config.t5.decoder_seq_length
    return TrainingParts(vocabulary=vocabulary, shape=shape, datasets=datasets, collate=collate_t5,
                         tokens_per_sample=encoder + decoder, flops_per_token=flops_per_token(shape, encoder, decoder))
