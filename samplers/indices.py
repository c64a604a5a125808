"""Index math of GPT and blended datasets: pure array-in/array-out functions, exact at every boundary.

    rng = np.random.RandomState(1234)              # one stream: document index first, then shuffle
    epochs = num_epochs(num_tokens, num_samples=4000, sequence_length=128, extra_tokens=1)
    separate, first = final_epoch_split(num_tokens, epochs, 4000, 128, 1)
    document_index = build_document_index(np.arange(0, 209, dtype=np.int32), epochs, separate, rng)
    sample_index = build_sample_index(lengths, document_index, epochs * num_tokens, 128, 1,
                                      drop_last_partial_sample=True)
    shuffle_index = build_shuffle_index(first if separate else len(sample_index) - 1,
                                        len(sample_index) - 1, rng)

Every formula and dtype rule is megatron-core's (see MEGATRON_FORMAT.md §5-6), except where Megatron
is wrong: the number of samples with a partial last sample is computed in exact integer arithmetic
(Megatron's C++ uses single-precision float and loses one sample above ~1e9 tokens), the dataset
id dtype of a blend grows with the number of datasets instead of failing at 32767, and blending never
picks a zero-weight or exhausted dataset (Megatron's float rounding can; otherwise identical).
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import numpy as np

from indexed_dataset.machine import available_memory_bytes, format_gib

from . import kernels
from .errors import IndexMemoryError

SEPARATE_FINAL_EPOCH_THRESHOLD = 0.80
"""Megatron shuffles the last epoch apart when it contributes fewer than 80% of an epoch's samples, so
that a mostly unused epoch does not mix its few samples into the others (they all come last instead)."""

MID_LEVEL_DATASET_SURPLUS = 0.005
"""Megatron builds each blend member with 0.5% more samples than its share, a safety margin that the
greedy blend (which can run ahead of a member's exact share by a sample or two) never exhausts."""

INT32_MAX = int(np.iinfo(np.int32).max)
UINT32_MAX = int(np.iinfo(np.uint32).max)
INT16_MAX = int(np.iinfo(np.int16).max)


def num_epochs(num_tokens: int, num_samples: Optional[int], sequence_length: int, extra_tokens: int) -> int:
    """Epochs E needed for `num_samples` samples: the smallest E >= 1 with E*T >= num_samples*L + extra.

    Args:
        num_tokens: tokens per epoch T (> 0).
        num_samples: samples wanted; None means exactly one epoch.
        sequence_length: tokens per sample L.
        extra_tokens: 0 or 1, tokens read beyond L per sample.
    """
    if num_samples is None:
        return 1
    required = num_samples * sequence_length + extra_tokens
    return max(1, -(-required // num_tokens))


def num_samples_in_epochs(total_tokens: int, sequence_length: int, extra_tokens: int, drop_last_partial_sample: bool) -> int:
    """Samples n that `total_tokens` (all epochs) yield: floor((total - extra) / L), or ceil with a partial last.

    The ceiling is exact integer arithmetic; Megatron computes it in single-precision float.
    """
    usable = max(total_tokens - extra_tokens, 0)
    if drop_last_partial_sample:
        return usable // sequence_length
    return -(-usable // sequence_length)


def final_epoch_split(
    num_tokens: int,
    epochs: int,
    num_samples: Optional[int],
    sequence_length: int,
    extra_tokens: int,
    threshold: float = SEPARATE_FINAL_EPOCH_THRESHOLD,
) -> tuple[bool, int]:
    """Whether the last epoch is shuffled apart, and how many samples come before it.

    Args:
        num_tokens: tokens per epoch T.
        epochs: E from `num_epochs`.
        num_samples: samples wanted (None: one epoch).
        sequence_length: tokens per sample L.
        extra_tokens: 0 or 1.
        threshold: fraction of an epoch below which the last epoch is separate.

    Returns:
        (separate, samples of the first E - 1 epochs); (False, 0) for a single epoch.
    """
    if epochs == 1 or num_samples is None:
        return False, 0
    samples_before_final = ((epochs - 1) * num_tokens - extra_tokens) // sequence_length
    samples_from_final = num_samples - samples_before_final
    samples_per_epoch = (num_tokens - extra_tokens) // sequence_length
    # int(threshold * n) in float, as Megatron, so the decision flips at the same sample count.
    return samples_from_final < int(threshold * samples_per_epoch), samples_before_final


def sequence_id_dtype(num_sequences: int) -> np.dtype:
    """int32 (Megatron's document index dtype) while every sequence id fits, else int64."""
    return np.dtype(np.int32) if num_sequences - 1 <= INT32_MAX else np.dtype(np.int64)


def build_document_index(
    sequence_ids: np.ndarray, epochs: int, separate_final_epoch: bool, rng: np.random.RandomState
) -> np.ndarray:
    """The split's sequence ids repeated for every epoch and shuffled (Megatron's _build_document_index).

    Args:
        sequence_ids: int [N], the split's sequence ids in order (int32 or int64; kept).
        epochs: E >= 1.
        separate_final_epoch: shuffle the first E - 1 epochs together and the last one apart.
        rng: the dataset's RandomState, advanced by one shuffle (two when separate).

    Returns:
        [E * N] array of sequence ids, `sequence_ids.dtype`.
    """
    document_index = np.tile(sequence_ids, epochs)
    if separate_final_epoch and epochs > 1:
        # Shuffling views in place draws exactly what Megatron's shuffle-then-concatenate draws.
        boundary = (epochs - 1) * len(sequence_ids)
        rng.shuffle(document_index[:boundary])
        rng.shuffle(document_index[boundary:])
    else:
        rng.shuffle(document_index)
    return document_index


def sample_index_dtype(num_positions: int) -> np.dtype:
    """int32 when every value fits, else int64 (Megatron's rule).

    Column 0 is below `num_positions`; column 1 is a token offset bounded by a sequence length,
    which the format stores as int32, so only the document index length decides.
    """
    return np.dtype(np.int32) if num_positions <= INT32_MAX else np.dtype(np.int64)


def build_sample_index(
    sequence_lengths: np.ndarray,
    document_index: np.ndarray,
    total_tokens: int,
    sequence_length: int,
    extra_tokens: int,
    drop_last_partial_sample: bool,
) -> np.ndarray:
    """Start (position in the document index, token offset) of every sample, plus the end of the last.

    Args:
        sequence_lengths: int32 [S], tokens per sequence of the whole dataset.
        document_index: int [D], from `build_document_index`.
        total_tokens: tokens of all of `document_index` (epochs * tokens per epoch), as Megatron
            passes it, which spares a gather over the whole document index.
        sequence_length: tokens per sample L.
        extra_tokens: 0 or 1, tokens read beyond L per sample.
        drop_last_partial_sample: drop a last sample shorter than L + extra (else keep it; the
            dataset pads it).

    Returns:
        [n + 1, 2] int32 or int64 (`sample_index_dtype`); sample i covers row i up to and including
        token `row[i + 1].offset + extra - 1` of position `row[i + 1].position`.
    """
    num_samples = num_samples_in_epochs(total_tokens, sequence_length, extra_tokens, drop_last_partial_sample)
    out = np.empty((num_samples + 1, 2), dtype=sample_index_dtype(len(document_index)))
    if num_samples == 0:
        out[0] = 0
        return out
    kernels.fill_sample_index(sequence_lengths, document_index, sequence_length, extra_tokens, out)
    return out


def shuffle_index_dtype(num_samples: int) -> np.dtype:
    """uint32, or int64 from 2^32 - 2 samples on (Megatron's bound)."""
    return np.dtype(np.int64) if num_samples >= UINT32_MAX - 1 else np.dtype(np.uint32)


def build_shuffle_index(num_samples_first: int, num_samples: int, rng: np.random.RandomState) -> np.ndarray:
    """A permutation of the sample ids: [0, first) shuffled, then [first, total) shuffled apart.

    Args:
        num_samples_first: samples before the separate final epoch (= num_samples when not separate).
        num_samples: total samples n.
        rng: the dataset's RandomState, continued after `build_document_index`.

    Returns:
        [n] uint32 or int64 (`shuffle_index_dtype`).
    """
    shuffle_index = np.arange(num_samples, dtype=shuffle_index_dtype(num_samples))
    rng.shuffle(shuffle_index[:num_samples_first])
    if num_samples_first < num_samples:
        rng.shuffle(shuffle_index[num_samples_first:])
    return shuffle_index


def check_index_fits(num_bytes: int, what: str) -> None:
    """Refuse to build index arrays of `num_bytes` that this machine's available memory cannot hold, before
    any is allocated (numpy would fail with a MemoryError, or the system start swapping, after minutes).

    Args:
        num_bytes: the arrays' bytes, from their lengths and dtypes.
        what: the dataset and split they index, and why they are that large (the sample count).

    Raises:
        IndexMemoryError: one line with the estimate in GiB.
    """
    available = available_memory_bytes()
    if num_bytes > available:
        raise IndexMemoryError(f"{what}: the index arrays need {format_gib(num_bytes)} of memory, more than the "
                               f"{format_gib(available)} this machine has available; ask for fewer samples")


def blend_index_bytes(num_datasets: int, size: int) -> int:
    """Bytes of the two arrays of a blend of `size` samples (`build_blending_indices`)."""
    return size * (dataset_id_dtype(num_datasets).itemsize + np.dtype(np.int64).itemsize)


def build_blend_indices(weights: Sequence[float], size: int, exhaustive: bool, what: str) -> tuple[np.ndarray, np.ndarray]:
    """A blend's two arrays, refused before any is allocated when this machine's memory cannot hold them.

    Args:
        weights: normalised weights (`build_blending_indices`), or, when `exhaustive`, samples per dataset
            (`build_exhaustive_blending_indices`).
        size: samples of a weighted blend (ignored when `exhaustive`: the sizes sum to it).
        exhaustive: take every sample of every dataset exactly once.
        what: the blend and split, for the error.

    Returns:
        (dataset ids of `dataset_id_dtype`, sample id inside that dataset int64), one entry per sample.

    Raises:
        IndexMemoryError: one line with the estimate in GiB.
    """
    total = int(sum(weights)) if exhaustive else size
    check_index_fits(blend_index_bytes(len(weights), total), what)
    return build_exhaustive_blending_indices(weights) if exhaustive else build_blending_indices(weights, size)


def dataset_id_dtype(num_datasets: int) -> np.dtype:
    """int16 (Megatron's dtype) up to 32768 datasets, int32 beyond: no cliff."""
    return np.dtype(np.int16) if num_datasets - 1 <= INT16_MAX else np.dtype(np.int32)


def blend_sizes(weights: Sequence[float], size: int, surplus: float = 0.0) -> list[int]:
    """Samples asked of each member: ceil(ceil(size * w) * (1 + surplus)) (Megatron's rule, in float64).

    With surplus 0 these are the shares the blend takes; with `MID_LEVEL_DATASET_SURPLUS` they are
    the sizes the members are built with.
    """
    return [int(math.ceil(math.ceil(size * weight) * (1 + surplus))) for weight in weights]


def build_blending_indices(weights: Sequence[float], size: int) -> tuple[np.ndarray, np.ndarray]:
    """Deterministic weighted interleaving of `size` samples (no RNG).

    Args:
        weights: normalised weights, one per dataset (zero allowed).
        size: number of samples.

    Returns:
        (dataset ids [size] of `dataset_id_dtype`, sample id inside that dataset int64 [size]).
    """
    weights = np.asarray(weights, dtype=np.float64)
    dataset_index = np.empty(size, dtype=dataset_id_dtype(len(weights)))
    dataset_sample_index = np.empty(size, dtype=np.int64)
    kernels.fill_blending_indices(weights, dataset_index, dataset_sample_index)
    return dataset_index, dataset_sample_index


def build_exhaustive_blending_indices(sizes: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """Interleaving that takes every sample of every dataset exactly once, in proportion to the sizes.

    Args:
        sizes: samples per dataset (zero allowed).

    Returns:
        (dataset ids [sum(sizes)] of `dataset_id_dtype`, sample id int64 [sum(sizes)]).
    """
    sizes = np.asarray(sizes, dtype=np.int64)
    total = int(sizes.sum())
    dataset_index = np.empty(total, dtype=dataset_id_dtype(len(sizes)))
    dataset_sample_index = np.empty(total, dtype=np.int64)
    if total:
        kernels.fill_exhaustive_blending_indices(sizes, dataset_index, dataset_sample_index)
    return dataset_index, dataset_sample_index
