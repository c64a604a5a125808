"""T5 span-corruption samples over a sentence-split dataset (`preprocess-data --split-sentences`; any format).

    config = T5DatasetConfig(data_prefix="data/x_text_sentence", split="949,50,1",
                             sentinel_ids=tuple(range(32099, 31999, -1)), pad_id=0, decoder_start_id=0, eos_id=1)
    train, valid, test = build_t5_datasets(config, sizes=(10000, 100, None))
    item = train[0]   # encoder_input_ids [Le], decoder_input_ids [Ld], labels [Ld], loss_mask [Ld],
                      # encoder_attention_mask [Le], decoder_attention_mask [Ld]
    view = train.view(0)   # unpadded: tokens, noise mask, encoder input (with sentinels), decoder target
    report = inspect_t5_splits(config, sizes=(10000, 100, None), sample_ids=(0, 1))   # for inspect-index

Megatron's T5 semantics (megatron/core/datasets/t5_dataset.py and masked_dataset.py): splits are
ranges of documents; a sample is whole sentences of one document up to a target length (see
`t5.indices`), truncated to it; its noise spans are replaced by sentinel ids in the encoder input,
and the decoder target lists each sentinel followed by the tokens it replaced, then EOS. The decoder
input is the target shifted right behind `decoder_start_id` (Megatron: BOS; Hugging Face T5: the pad
id). Sample k's noise comes from RandomState(seed + k), so a sample is the same in every run.

The sample index (which sentences form sample k, and its target length) is megatron-core's, row for
row, for encoder_seq_length - 2 tokens (see `t5.indices`). Deviations, each on purpose: the span
choice is the T5 paper's exact-density one, not Megatron's WordPiece n-grams (see `t5.masking`);
padded labels are the pad id with loss mask 0 (Megatron: -1).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import numpy as np
import torch

from ..builder import Sizes
from ..sentences import SEED_MODULUS, SentenceSampleDataset, build_sentence_splits, sample_random_state
from ..sources import TokenSource
from ..splits import DEFAULT_SPLIT, parse_split
from .indices import MIN_TARGET_LENGTH, build_t5_sample_index
from .masking import corrupt_spans, noise_span_counts, random_spans_noise_mask

T5_CACHE_FORMAT = "tokenmill-t5-indices-2"
"""Part of every cache description: bump it when the sample index's meaning changes."""
RESERVED_POSITIONS = 2
"""megatron-core builds T5 sample indices for encoder_seq_length - 2 tokens (room for BOS and EOS)."""
def max_t5_tokens(encoder_seq_length: int) -> int:
    """Most raw tokens of a sample (its target length is at most this), Megatron's rule."""
    return encoder_seq_length - RESERVED_POSITIONS


@dataclass(kw_only=True, slots=True)
class T5DatasetConfig:
    """How to turn a sentence-split dataset into T5 span-corruption samples."""

    data_prefix: str
    """Dataset prefix (one sequence per sentence, documents via document_indices)."""
    sentinel_ids: tuple[int, ...]
    """Token id of sentinel k (`<extra_id_k>`), in order; at least the most spans a sample can have."""
    pad_id: int
    """Padding id of encoder input, decoder input and labels."""
    decoder_start_id: int
    """First decoder input token (Hugging Face T5/mT5: the pad id 0; Megatron: BOS)."""
    eos_id: int
    """Last target token."""
    split: str = DEFAULT_SPLIT
    """Split fractions over documents."""
    encoder_seq_length: int = 512
    """Encoder input positions Le; a sample holds at most Le - 2 raw tokens (Megatron's rule)."""
    decoder_seq_length: int = 128
    """Decoder positions Ld."""
    noise_density: float = 0.15
    """Fraction of a sample's tokens replaced by spans."""
    mean_noise_span_length: float = 3.0
    """Average tokens per noise span."""
    short_seq_prob: float = 0.1
    """Probability of a shorter random target length (Megatron's default for T5)."""
    random_seed: int = 1234
    """Seed of the sample index and of every sample's noise."""
    path_to_cache: Optional[str] = None
    """Index cache directory; None: `index-cache/` beside the dataset."""

    def __post_init__(self) -> None:
        if max_t5_tokens(self.encoder_seq_length) < MIN_TARGET_LENGTH:
            raise ValueError(f"encoder_seq_length must be >= {MIN_TARGET_LENGTH + RESERVED_POSITIONS}, "
                             f"got {self.encoder_seq_length}")
        if self.decoder_seq_length < 1:
            raise ValueError(f"decoder_seq_length must be >= 1, got {self.decoder_seq_length}")
        if not 0 < self.noise_density < 1:
            raise ValueError(f"noise_density must be in (0, 1), got {self.noise_density}")
        if self.mean_noise_span_length < 1:
            raise ValueError(f"mean_noise_span_length must be >= 1, got {self.mean_noise_span_length}")
        if not 0 <= self.short_seq_prob <= 1:
            raise ValueError(f"short_seq_prob must be in [0, 1], got {self.short_seq_prob}")
        parse_split(self.split)
        self.sentinel_ids = tuple(int(i) for i in self.sentinel_ids)
        noise, spans = noise_span_counts(np.arange(max_t5_tokens(self.encoder_seq_length) + 1), self.noise_density,
                                         self.mean_noise_span_length)
        if spans.max() > len(self.sentinel_ids):
            raise ValueError(f"samples of up to {self.encoder_seq_length} tokens have up to {spans.max()} noise spans "
                             f"but only {len(self.sentinel_ids)} sentinel ids are given (vocab_extra_ids)")
        # One sentinel per span, the span's tokens, and the start/EOS token.
        longest_target = int((noise + spans).max()) + 1
        if longest_target > self.decoder_seq_length:
            raise ValueError(f"decoder_seq_length {self.decoder_seq_length} is too short: samples of "
                             f"{self.encoder_seq_length} tokens need up to {longest_target} decoder positions")


@dataclass(frozen=True)
class T5SampleView:
    """One sample before padding."""

    tokens: np.ndarray
    """int64 [n]: the sample's original tokens."""
    noise_mask: np.ndarray
    """bool [n]: which of them are replaced."""
    encoder_input: np.ndarray
    """int64 [n - noise + spans]: kept tokens and one sentinel per span."""
    decoder_target: np.ndarray
    """int64 [noise + spans + 1]: each sentinel, the tokens it replaced, then EOS."""


def _sample_tokens(dataset: TokenSource, row: np.ndarray) -> np.ndarray:
    """The sentences [first, end) of a sample row, concatenated and cut at its target length (int64)."""
    first, end, target = (int(x) for x in row)
    return dataset.sequences(first, end)[:target].astype(np.int64)


class T5Dataset(SentenceSampleDataset):
    """One split of T5 samples.

    Args:
        dataset: the sentence-split dataset.
        split: "train", "valid" or "test".
        document_range: the split's [begin, end) document ids.
        sample_index: int64 [n, 3] from `build_t5_sample_index`.
        config: the sample options.
    """

    def view(self, idx: int) -> T5SampleView:
        """The unpadded sample `idx` (negative counts from the end)."""
        idx = range(len(self))[idx]
        config = self.config
        row = self.sample_index[idx]
        tokens = _sample_tokens(self.dataset, row)
        rng = sample_random_state((config.random_seed + idx) % SEED_MODULUS)
        noise = random_spans_noise_mask(len(tokens), config.noise_density, config.mean_noise_span_length, rng)
        encoder, target = corrupt_spans(tokens, noise, np.asarray(config.sentinel_ids))
        return T5SampleView(tokens, noise, encoder, np.append(target, config.eos_id))

    def __getitem__(self, idx: int) -> dict[str, torch.Tensor]:
        config = self.config
        view = self.view(int(idx))
        labels = view.decoder_target
        decoder_input = np.concatenate(([config.decoder_start_id], labels[:-1]))
        encoder_length, decoder_length = len(view.encoder_input), len(labels)

        def pad(ids: np.ndarray, length: int) -> torch.Tensor:
            return torch.from_numpy(np.pad(ids, (0, length - len(ids)), constant_values=config.pad_id))

        def mask(length: int, total: int) -> torch.Tensor:
            return (torch.arange(total) < length).long()

        return {
            "encoder_input_ids": pad(view.encoder_input, config.encoder_seq_length),
            "decoder_input_ids": pad(decoder_input, config.decoder_seq_length),
            "labels": pad(labels, config.decoder_seq_length),
            "loss_mask": mask(decoder_length, config.decoder_seq_length).float(),
            "encoder_attention_mask": mask(encoder_length, config.encoder_seq_length),
            "decoder_attention_mask": mask(decoder_length, config.decoder_seq_length),
        }


def t5_index_description(dataset: TokenSource, split: str, document_range: tuple[int, int],
                         num_samples: Optional[int], config: T5DatasetConfig) -> dict[str, object]:
    """Everything that determines a split's sample index (the cache key)."""
    return {
        "class": "T5Dataset",
        "format": T5_CACHE_FORMAT,
        "dataset": dataset.fingerprint(),
        "split": split,
        "document_range": list(document_range),
        "num_samples": num_samples,
        "max_seq_length": max_t5_tokens(config.encoder_seq_length),
        "short_seq_prob": config.short_seq_prob,
        "random_seed": config.random_seed,
    }


def build_t5_datasets(config: T5DatasetConfig, sizes: Optional[Sizes] = None) -> tuple[Optional[T5Dataset], ...]:
    """The train, valid and test T5 datasets, their sample indices loaded from the cache or built.

    Args:
        config: dataset and sample options.
        sizes: samples wanted per split (None, or a None entry: one epoch). Whole epochs are walked,
            so a split may hold more samples than asked.

    Returns:
        (train, valid, test), None for a split with zero fraction, or no documents and no size.

    Raises:
        EmptySplitError: a split was asked for samples but yields none.
        IndexFormatError: the dataset's files are missing or damaged.
    """

    def build_index(dataset: TokenSource, document_range: tuple[int, int], size: Optional[int]) -> np.ndarray:
        return build_t5_sample_index(dataset.document_indices, dataset.sequence_lengths, document_range, size,
                                     max_t5_tokens(config.encoder_seq_length), config.short_seq_prob,
                                     config.random_seed)

    splits = build_sentence_splits(
        config.data_prefix, config.split, config.path_to_cache, sizes, kind="T5", stem="t5",
        description=lambda dataset, name, document_range, size: t5_index_description(
            dataset, name, document_range, size, config),
        build_index=build_index, no_sample="T5 sample")
    return tuple(None if split is None else T5Dataset(split.dataset, split.name, split.document_range,
                                                      split.sample_index, config) for split in splits)


def format_t5_ids(ids: Sequence[int], sentinel_ids: Sequence[int], decode: Callable[[list[int]], str]) -> str:
    """Text of ids with each sentinel written `<extra_id_k>` and the runs between them decoded.

    Args:
        ids: token ids (an encoder input or a decoder target).
        sentinel_ids: sentinel k's id at position k.
        decode: the tokenizer's decode (list of ids -> text).
    """
    sentinel_number = {int(sentinel): k for k, sentinel in enumerate(sentinel_ids)}
    parts: list[str] = []
    run: list[int] = []
    for token in (int(t) for t in ids):
        if token in sentinel_number:
            if run:
                parts.append(decode(run))
            parts.append(f"<extra_id_{sentinel_number[token]}>")
            run = []
        else:
            run.append(token)
    if run:
        parts.append(decode(run))
    return " ".join(parts)


def inspect_t5_splits(config: T5DatasetConfig, sizes: Optional[Sizes] = None,
                      sample_ids: Sequence[int] = (0,)) -> list[Optional[dict]]:
    """What T5 training sees of each split, as plain data (JSON-ready): the library side of
    `inspect-index` for T5. Indices come from (and go to) the training cache.

    Args:
        config: the dataset and sample options of the run.
        sizes: samples wanted per split (None entries: one epoch).
        sample_ids: items to show (negative counts from the end; ids outside a split are skipped).

    Returns:
        One entry per split: None when absent, else {"split", "document_range", "num_samples",
        "samples": {id: {"tokens", "noise_positions", "encoder_input", "decoder_target"}}} with
        int lists; decode them with `format_t5_ids`.
    """
    report: list[Optional[dict]] = []
    for dataset in build_t5_datasets(config, sizes):
        if dataset is None:
            report.append(None)
            continue
        samples = {}
        for sample_id in sample_ids:
            if -len(dataset) <= sample_id < len(dataset):
                view = dataset.view(sample_id)
                samples[sample_id] = {"tokens": view.tokens.tolist(),
                                      "noise_positions": np.flatnonzero(view.noise_mask).tolist(),
                                      "encoder_input": view.encoder_input.tolist(),
                                      "decoder_target": view.decoder_target.tolist()}
        report.append({"split": dataset.split, "document_range": list(dataset.document_range),
                       "num_samples": len(dataset), "samples": samples})
    return report
