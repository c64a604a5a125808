"""What the t5 section of `train --model t5` (`trainer.models.t5.settings.T5Config`) builds: the shape,
special ids, datasets.

    t5 = T5Config(encoder_seq_length=512, decoder_seq_length=128, vocab_extra_ids=100)
    special = resolve_t5_special_ids(config.data, t5.vocab_extra_ids)
    shape = t5_shape(config.model, t5, special.vocab_size, tp)        # hidden_size, heads, layers from ModelConfig
    train_ds, valid_ds, test_ds = build_t5_training_datasets(config.data, t5, special, sizes, config.masking)

Field names follow Megatron's T5 flags where Megatron has one (--encoder-seq-length,
--decoder-seq-length, --kv-channels, --decoder-num-layers, --vocab-extra-ids, --mask-prob,
--short-seq-prob, --untie-embeddings-and-output-weights, --relative-attention-num-buckets,
--relative-attention-max-distance); the MLP kind and the mean span length are
Hugging Face's (feed_forward_proj) and the T5 paper's.
"""

from __future__ import annotations

import os
from pathlib import Path

from torch.utils.data import Dataset

from indexed_dataset.structured_files import read_json_file
from preprocess.tokenizers import Tokenizer, TokenizerConfig, TokenizerError
from preprocess.tokenizers.t5 import T5SpecialIds, t5_special_ids, t5_text_tokenizer
from samplers.splits import DEFAULT_SPLIT
from samplers.t5.blend import build_t5_blend, build_t5_blend_per_split
from samplers.t5.dataset import T5DatasetConfig
from trainer.config import DataConfig, MaskingConfig, ModelConfig, MoEConfig
from trainer.data.batches import check_data_files
from trainer.errors import TrainConfigError
from trainer.parallel.dims import pad_vocab_size
from trainer.models.t5.model import T5Shape
from trainer.models.t5.settings import T5Config
from trainer.moe.settings import moe_settings


def t5_shape(model: ModelConfig, t5: T5Config, vocab_size: int, tp: int, moe: MoEConfig | None = None) -> T5Shape:
    """The T5's dimensions: width, heads, encoder layers, MLP width, dropout and epsilon from
    ``model`` (with the head width and the head's tying, which other families read too), the rest from ``t5``,
    experts from ``moe`` (None: dense); the vocabulary padded for ``tp`` as Megatron does."""
    tied = not model.untie_embeddings_and_output_weights
    scaled = tied if t5.scale_decoder_outputs is None else t5.scale_decoder_outputs
    return T5Shape(vocab_size=pad_vocab_size(vocab_size, model.make_vocab_size_divisible_by, tp),
                   d_model=model.hidden_size, d_kv=model.kv_channels or model.hidden_size // model.num_attention_heads,
                   d_ff=model.ffn_hidden_size, num_heads=model.num_attention_heads,
                   num_encoder_layers=model.num_layers, num_decoder_layers=t5.decoder_num_layers or model.num_layers,
                   feed_forward=t5.feed_forward_proj, tie_word_embeddings=tied, scale_decoder_outputs=scaled,
                   relative_attention_num_buckets=t5.relative_attention_num_buckets,
                   relative_attention_max_distance=t5.relative_attention_max_distance,
                   layer_norm_epsilon=model.layernorm_epsilon, dropout_rate=model.hidden_dropout,
                   moe=moe_settings(moe) if moe is not None else None)


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
        return t5_special_ids(tokenizer, data.tokenizer_type, vocab_extra_ids)
    except (ValueError, TokenizerError) as error:
        raise TrainConfigError(str(error)) from error


# Hugging Face's T5Tokenizer: `extra_ids` sentinels unless tokenizer_config.json says otherwise.
HF_TOKENIZER_CONFIG = "tokenizer_config.json"
HF_DEFAULT_EXTRA_IDS = 100


def _hf_extra_ids(directory: str | os.PathLike) -> int:
    """The sentinel count a HF directory's tokenizer_config.json gives (``extra_ids``), else T5Tokenizer's default."""
    path = Path(directory) / HF_TOKENIZER_CONFIG
    try:
        content = read_json_file(path, error=TrainConfigError) if path.is_file() else {}
    except OSError as error:
        raise TrainConfigError(f"{path}: cannot read ({error.strerror})") from None
    value = content.get("extra_ids") if isinstance(content, dict) else None
    return value if isinstance(value, int) and value >= 0 else HF_DEFAULT_EXTRA_IDS


def t5_text_tokenizer_for(tokenizer: Tokenizer, tokenizer_config: TokenizerConfig, vocab_size: int,
                          hf_directory: str | os.PathLike | None) -> Tokenizer:
    """The tokenizer a T5's prompts and outputs go through: sentinels and special tokens by name.

    Args:
        tokenizer: built from ``tokenizer_config``.
        vocab_size: the model's real vocabulary (a checkpoint's: the tokenizer's ids plus its sentinels).
        hf_directory: a HF directory the model comes from (its vocabulary is padded, so the sentinel count
            comes from its tokenizer_config.json), or None for a checkpoint.

    Raises:
        TrainConfigError: a tokenizer without a T5 convention.
    """
    try:
        own = t5_special_ids(tokenizer, tokenizer_config.tokenizer_type, 0).vocab_size
        extra = _hf_extra_ids(hf_directory) if hf_directory is not None else max(vocab_size - own, 0)
        return t5_text_tokenizer(tokenizer, t5_special_ids(tokenizer, tokenizer_config.tokenizer_type, extra))
    except TokenizerError as error:
        raise TrainConfigError(str(error)) from error


def build_t5_training_datasets(data: DataConfig, t5: T5Config, special: T5SpecialIds, sizes: tuple[int, int, int],
                               masking: MaskingConfig | None = None) -> tuple[Dataset | None, ...]:
    """The train, valid and test T5 datasets of the run (noise density and short samples from ``masking``,
    default its defaults): one sentence-split dataset, or a blend of several
    (``data_path`` W1 P1 W2 P2 ..., weighted as GPT blends are; ``dataset`` P1 P2: by their sample counts),
    or one such blend per split used whole (``train_data_path`` ..., None for a split without one).

    Raises:
        TrainConfigError: a missing dataset file, bad sample options or blend weights.
    """
    check_data_files(data)
    masking = masking if masking is not None else MaskingConfig()
    per_split = data.blend_per_split
    # Any member names the shared config (each member's prefix replaces it); per-split paths always have train.
    prefixes = per_split[0][0] if per_split is not None else data.blend[0]
    try:
        # With per-split blends the split string is each split's own (`build_t5_blend_per_split`).
        config = T5DatasetConfig(data_prefix=prefixes[0], sentinel_ids=special.sentinels, pad_id=special.pad,
                                 decoder_start_id=special.decoder_start, eos_id=special.eos,
                                 split=data.split or DEFAULT_SPLIT,
                                 encoder_seq_length=t5.encoder_seq_length, decoder_seq_length=t5.decoder_seq_length,
                                 noise_density=masking.mask_prob, mean_noise_span_length=t5.mean_noise_span_length,
                                 short_seq_prob=masking.short_seq_prob, random_seed=data.seed,
                                 path_to_cache=data.data_cache_path)
        if per_split is not None:
            return build_t5_blend_per_split(per_split, config, sizes)
        return build_t5_blend(*data.blend, config, sizes)
    except ValueError as error:  # BlendFormatError too
        raise TrainConfigError(str(error)) from error
