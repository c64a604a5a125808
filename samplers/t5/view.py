"""The T5 sample kind of `inspect-index`'s training view: sample counts and span-corrupted samples of each
split of one sentence-split dataset, as plain dicts and as text (see `samplers.view`)."""

from __future__ import annotations

from ..view import TrainingViewConfig, ViewTokens, format_view_splits
from .dataset import T5DatasetConfig, format_t5_ids, inspect_t5_splits

SENTINEL_NAME = "<extra_id_{}>"
"""How the vocabulary names sentinel k."""


def training_view(data: str, config: TrainingViewConfig, view_tokens: ViewTokens) -> list[dict | None]:
    """What a ``train --model t5`` run sees of each split: sample counts and span-corrupted samples.

    Args:
        data: sentence-split dataset prefix.
        config: the sampling configuration (``model`` t5).
        view_tokens: the run's tokenizer (the pad, EOS, decoder-start and sentinel ids, and decoding).

    Returns:
        One entry per split: None when absent, else `inspect_t5_splits`'s dict whose samples also carry
        ``encoder_text`` and ``target_text`` (sentinels as `<extra_id_k>`).

    Raises:
        TokenmillError: damaged dataset, a tokenizer without a T5 convention, or bad sample options.
        ValueError: sample options the T5 dataset rejects (too short a decoder, too few sentinels).
    """
    vocabulary = view_tokens.vocabulary(config.vocab_extra_ids)
    sentinels = vocabulary.numbered(SENTINEL_NAME)
    dataset_config = T5DatasetConfig(data_prefix=data, sentinel_ids=sentinels, pad_id=vocabulary.role("pad"),
                                     decoder_start_id=vocabulary.role("decoder_start"), eos_id=vocabulary.role("eos"),
                                     split=config.split,
                                     encoder_seq_length=config.sequence_length,
                                     decoder_seq_length=config.decoder_sequence_length, random_seed=config.seed,
                                     path_to_cache=config.path_to_cache)
    view = inspect_t5_splits(dataset_config, config.sizes, config.sample_ids)
    for split in view:
        for sample in (split["samples"].values() if split is not None else ()):
            sample["encoder_text"] = format_t5_ids(sample["encoder_input"], sentinels, view_tokens.decode)
            sample["target_text"] = format_t5_ids(sample["decoder_target"], sentinels, view_tokens.decode)
    return view


def format_training_view(view: list[dict | None], config: TrainingViewConfig) -> str:
    """The text `inspect-index --model t5` prints for a T5 training view."""
    title = (f"training view   t5, encoder {config.sequence_length}, decoder {config.decoder_sequence_length}, "
             f"split {config.split}, seed {config.seed}")

    def render(name: str, sample_id: int, sample: dict) -> str:
        return f"--- {name} sample {sample_id} ---\ninput:  {sample['encoder_text']}\ntarget: {sample['target_text']}"

    return format_view_splits(title, view, render)
