"""Numba kernels for the hot loops of index building (no compile step: `cache=True` JITs once per machine).

Each kernel fills a preallocated output so the caller chooses the dtype, and each has a plain-numpy
twin in `samplers/reference.py` that the tests use as the oracle. All arithmetic is int64 (or float64
for blending weights, in the same operation order as Megatron's helpers.cpp so ties break identically).

    >>> out = np.empty((3, 2), np.int32)
    >>> fill_sample_index(np.array([5, 5], np.int32), np.array([0, 1], np.int32), 4, 1, out)
    >>> out.tolist()
    [[0, 0], [0, 4], [1, 3]]
"""

from __future__ import annotations

import numba
import numpy as np


@numba.njit(cache=True, nogil=True)
def fill_sample_index(sequence_lengths, document_index, sequence_length, extra_tokens, out):
    """Walk the document index and record where each sample starts (Megatron's build_sample_idx).

    Args:
        sequence_lengths: int32 [S], tokens per sequence of the whole dataset.
        document_index: int32 or int64 [D], sequence ids in reading order (all epochs).
        sequence_length: tokens per sample L.
        extra_tokens: 1 if each sample reads L + 1 tokens (the label of the last position), else 0.
        out: [n + 1, 2] int32 or int64, filled in place: row i = (position in `document_index`,
            token offset inside that sequence) where sample i starts; row n ends sample n - 1.
            If the tokens run out (a partial last sample) the last row is (D - 1, last length - extra).
    """
    num_positions = document_index.shape[0]
    position = 0
    offset = np.int64(0)
    out[0, 0] = 0
    out[0, 1] = 0
    for row in range(1, out.shape[0]):
        remaining = np.int64(sequence_length + extra_tokens)
        while True:
            available = np.int64(sequence_lengths[document_index[position]]) - offset
            remaining -= available
            if remaining <= 0:
                # The sample ends inside this sequence; the next one starts `extra_tokens` earlier
                # so that consecutive samples overlap by the label token.
                offset += remaining + available - extra_tokens
                break
            if position == num_positions - 1:
                offset = np.int64(sequence_lengths[document_index[position]]) - extra_tokens
                break
            position += 1
            offset = np.int64(0)
        out[row, 0] = position
        out[row, 1] = offset


@numba.njit(cache=True, nogil=True)
def _fill_greedy(ids, weights, limits, dataset_index, dataset_sample_index):
    """Greedy interleaving: sample i goes to the open dataset with the largest error.

    The error of dataset j is `weights[j] * max(i, 1) - count[j]`, in Megatron's float64 operation
    order; the strict `>` over ascending ids sends ties to the lowest id. Only datasets of positive
    weight are passed in (`ids` maps them back), and a dataset closes when its count reaches
    `limits[j]` (negative: never). Megatron can let rounding pick a zero-weight or exhausted dataset
    (all errors ~0); this never does, and otherwise agrees exactly. Keeping the open datasets in a
    shrinking list leaves the inner loop as lean as Megatron's.
    """
    counts = np.zeros(weights.shape[0], np.int64)
    open_datasets = np.arange(weights.shape[0])
    num_open = weights.shape[0]
    for i in range(dataset_index.shape[0]):
        scale = max(float(i), 1.0)
        best = open_datasets[0]
        best_error = weights[best] * scale - float(counts[best])
        for k in range(1, num_open):
            j = open_datasets[k]
            error = weights[j] * scale - float(counts[j])
            if error > best_error:
                best_error = error
                best = j
        dataset_index[i] = ids[best]
        dataset_sample_index[i] = counts[best]
        counts[best] += 1
        if counts[best] == limits[best]:
            position = 0
            while open_datasets[position] != best:
                position += 1
            open_datasets[position : num_open - 1] = open_datasets[position + 1 : num_open].copy()
            num_open -= 1


@numba.njit(cache=True, nogil=True)
def fill_blending_indices(weights, dataset_index, dataset_sample_index):
    """Weighted interleaving of `len(dataset_index)` samples (Megatron's build_blending_indices).

    Args:
        weights: float64 [N], normalised weights (at least one positive; zero = never chosen).
        dataset_index: [size] integer array, receives the chosen dataset ids.
        dataset_sample_index: int64 [size], receives the sample id inside the chosen dataset.
    """
    ids = np.nonzero(weights > 0.0)[0]
    _fill_greedy(ids, weights[ids], np.full(ids.shape[0], -1, np.int64), dataset_index, dataset_sample_index)


@numba.njit(cache=True, nogil=True)
def fill_exhaustive_blending_indices(sizes, dataset_index, dataset_sample_index):
    """Interleaving that uses every sample of every dataset exactly once (build_exhaustive_blending_indices).

    Weights are `sizes / sum(sizes)`, and a dataset closes once it has given all its samples.

    Args:
        sizes: int64 [N], samples per dataset (zero allowed: that dataset is never chosen).
        dataset_index: [sum(sizes)] integer array, receives the chosen dataset ids.
        dataset_sample_index: int64 [sum(sizes)], receives the sample id inside the chosen dataset.
    """
    ids = np.nonzero(sizes > 0)[0]
    weights = sizes / float(np.sum(sizes))
    _fill_greedy(ids, weights[ids], sizes[ids], dataset_index, dataset_sample_index)
