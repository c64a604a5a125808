"""`T5Config`: the settings `train --model t5` adds to `TrainConfig`, and what they build.

    t5 = T5Config(encoder_seq_length=512, decoder_seq_length=128, vocab_extra_ids=100)
    special = resolve_t5_special_ids(config.data, t5.vocab_extra_ids)
    shape = t5_shape(config.model, t5, special.vocab_size, tp)        # hidden_size, heads, layers from ModelConfig
    train_ds, valid_ds, test_ds = build_t5_training_datasets(config.data, t5, special, sizes)

Field names follow Megatron's T5 flags where Megatron has one (--encoder-seq-length,
--decoder-seq-length, --kv-channels, --decoder-num-layers, --vocab-extra-ids, --mask-prob,
--short-seq-prob, --untie-embeddings-and-output-weights); the MLP kind and the mean span length are
Hugging Face's (feed_forward_proj) and the T5 paper's.
"""

from __future__ import annotations

from dataclasses import dataclass

from samplers.t5_dataset import T5Dataset, T5DatasetConfig, build_t5_datasets
from trainer.config import DataConfig, ModelConfig, flag
from trainer.errors import TrainConfigError
from trainer.parallel_dims import pad_vocab_size
from trainer.t5_data import T5SpecialIds, t5_special_ids
from trainer.t5_model import FEED_FORWARD_KINDS, T5Shape


@dataclass(kw_only=True, slots=True)
class T5Config:
    """T5 span-corruption pre-training (used with --model t5)."""

    encoder_seq_length: int = 512
    """Encoder positions per sample."""
    decoder_seq_length: int = 128
    """Decoder positions per sample."""
    kv_channels: int | None = None
    """Channels per attention head (T5's d_kv); default hidden_size / num_attention_heads."""
    decoder_num_layers: int | None = None
    """Decoder blocks; default num_layers (the encoder's)."""
    vocab_extra_ids: int = 100
    """Sentinel tokens <extra_id_k> added to a vocabulary that has none."""
    feed_forward_proj: str = flag("relu", choices=FEED_FORWARD_KINDS)
    """MLP kind: relu (T5 v1.0) or gated-gelu (T5 v1.1, mT5)."""
    untie_embeddings_and_output_weights: bool = False
    """Separate LM head (v1.1, mT5); tied heads scale the decoder output by hidden_size**-0.5 (v1.0)."""
    mask_prob: float = 0.15
    """Noise density: the fraction of a sample's tokens replaced by spans."""
    mean_noise_span_length: float = 3.0
    """Average tokens per noise span."""
    short_seq_prob: float = 0.1
    """Probability of a sample with a shorter random target length."""

    def __post_init__(self) -> None:
        for name in ("encoder_seq_length", "decoder_seq_length", "kv_channels", "decoder_num_layers"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise TrainConfigError(f"{name} must be >= 1, got {value}")
        if self.vocab_extra_ids < 0:
            raise TrainConfigError(f"vocab_extra_ids must be >= 0, got {self.vocab_extra_ids}")


def t5_shape(model: ModelConfig, t5: T5Config, vocab_size: int, tp: int) -> T5Shape:
    """The T5's dimensions: width, heads, encoder layers, MLP width, dropout and epsilon from
    ``model``, the rest from ``t5``; the vocabulary padded for ``tp`` as Megatron does."""
    tied = not t5.untie_embeddings_and_output_weights
    return T5Shape(vocab_size=pad_vocab_size(vocab_size, model.make_vocab_size_divisible_by, tp),
                   d_model=model.hidden_size, d_kv=t5.kv_channels or model.hidden_size // model.num_attention_heads,
                   d_ff=model.ffn_hidden_size, num_heads=model.num_attention_heads,
                   num_encoder_layers=model.num_layers, num_decoder_layers=t5.decoder_num_layers or model.num_layers,
                   feed_forward=t5.feed_forward_proj, tie_word_embeddings=tied, scale_decoder_outputs=tied,
                   layer_norm_epsilon=model.layernorm_epsilon, dropout_rate=model.hidden_dropout)


def resolve_t5_special_ids(data: DataConfig, vocab_extra_ids: int) -> T5SpecialIds:
    """Pad, EOS, decoder-start and sentinel ids of the run's tokenizer.

    Raises:
        TrainConfigError: no tokenizer files, or a tokenizer without a T5 convention.
    """
    files = {name: getattr(data, name) for name in ("vocab_file", "merge_file", "tokenizer_model")
             if getattr(data, name) is not None}
    if not files:
        raise TrainConfigError("T5 needs the tokenizer (vocab_file or tokenizer_model) for its sentinel ids")
    # Imported here: the tokenizer libraries load only when a run names tokenizer files.
    from preprocess.tokenizers import TokenizerConfig, build_tokenizer

    try:
        tokenizer = build_tokenizer(TokenizerConfig(tokenizer_type=data.tokenizer_type, **files))
    except ValueError as error:
        raise TrainConfigError(str(error)) from error
    return t5_special_ids(tokenizer, data.tokenizer_type, vocab_extra_ids)


def build_t5_training_datasets(data: DataConfig, t5: T5Config, special: T5SpecialIds,
                               sizes: tuple[int, int, int]) -> tuple[T5Dataset | None, ...]:
    """The train, valid and test T5 datasets of the run (one sentence-split dataset prefix).

    Raises:
        TrainConfigError: a blend of several prefixes (not implemented for T5), or bad sample options.
    """
    prefixes, _ = data.blend
    if len(prefixes) != 1:
        raise TrainConfigError(f"T5 trains on one dataset prefix; got {len(prefixes)} ({' '.join(prefixes)})")
    try:
        config = T5DatasetConfig(data_prefix=prefixes[0], sentinel_ids=special.sentinels, pad_id=special.pad,
                                 decoder_start_id=special.decoder_start, eos_id=special.eos, split=data.split,
                                 encoder_seq_length=t5.encoder_seq_length, decoder_seq_length=t5.decoder_seq_length,
                                 noise_density=t5.mask_prob, mean_noise_span_length=t5.mean_noise_span_length,
                                 short_seq_prob=t5.short_seq_prob, random_seed=data.seed,
                                 path_to_cache=data.data_cache_path)
    except ValueError as error:
        raise TrainConfigError(str(error)) from error
    return build_t5_datasets(config, sizes)
