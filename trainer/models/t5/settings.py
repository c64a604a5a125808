"""The t5 flag section of ``train`` (`T5Config`): T5 span-corruption pre-training's own settings, which the
registry (`trainer.models`) adds to the flag table as section ``t5``; the settings T5 shares with other
families are core sections (``kv_channels`` in `trainer.config.ModelConfig`, ``mask_prob`` in
`trainer.config.MaskingConfig`).

    t5 = t5_settings(config)   # the run's section (its defaults when the config was built without one)
    t5.encoder_seq_length, t5.decoder_seq_length
"""

from __future__ import annotations

from dataclasses import dataclass

from trainer.config import AT_LEAST_ONE, NON_NEGATIVE, Range, TrainConfig, check_ranges, flag

SECTION = "t5"
# T5's MLP kinds (Hugging Face's feed_forward_proj): v1.0's ReLU, v1.1/mT5's gated GELU.
FEED_FORWARD_KINDS = ("relu", "gated-gelu")


@dataclass(kw_only=True, slots=True)
class T5Config:
    """T5 span-corruption pre-training (read with model t5; hidden_size, heads, ffn_hidden_size, layers from model)."""

    encoder_seq_length: int = flag(512, "--enc-seq-length", valid=AT_LEAST_ONE)
    """Encoder positions per sample (CPM-Pretrain: --enc-seq-length)."""
    decoder_seq_length: int = flag(128, "--dec-seq-length", valid=AT_LEAST_ONE)
    """Decoder positions per sample (CPM-Pretrain: --dec-seq-length)."""
    decoder_num_layers: int | None = flag(None, valid=AT_LEAST_ONE)
    """Decoder blocks; default num_layers (the encoder's)."""
    vocab_extra_ids: int = flag(100, valid=NON_NEGATIVE)
    """Sentinel tokens <extra_id_k> added to a vocabulary that has none."""
    feed_forward_proj: str = flag("relu", choices=FEED_FORWARD_KINDS)
    """MLP kind: relu (T5 v1.0) or gated-gelu (T5 v1.1, mT5)."""
    scale_decoder_outputs: bool | None = None
    """Scale the decoder output by hidden_size**-0.5 before the head; default: when the head is tied (T5
    v1.0). train --load-hf/--load take it from the model (transformers' mT5 never scales)."""
    relative_attention_num_buckets: int = flag(32, valid=AT_LEAST_ONE)
    """Relative position buckets of the attention bias (Megatron's and T5's default)."""
    relative_attention_max_distance: int = flag(128, valid=AT_LEAST_ONE)
    """Distance (positions) beyond which relative positions share the last bucket."""
    mean_noise_span_length: float = flag(3.0, valid=Range(1))
    """Average tokens per noise span."""

    def __post_init__(self) -> None:
        check_ranges(self)


# What the registry lists as the family's own section (`trainer.models.FAMILY_SETTINGS`).
SETTINGS = T5Config


def t5_settings(config: TrainConfig) -> T5Config:
    """The run's t5 section (its defaults, kept in ``config``, when the config was built without one)."""
    return config.section(SECTION, T5Config)


def t5_stack_layers(config: TrainConfig) -> int:
    """The layers of T5's deepest stack (encoder or decoder), from which every stack counts its MoE layers."""
    return max(config.model.num_layers, t5_settings(config).decoder_num_layers or 0)

