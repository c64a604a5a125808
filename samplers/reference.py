"""Plain-numpy twins of the numba kernels in `samplers/kernels.py`: the oracle of the tests.

They return new arrays instead of filling outputs, and are written for clarity, not speed: the sample
index is a vectorised search over cumulative token counts (a different algorithm from the kernel's
walk, so agreement is evidence), the blending functions are the greedy rule spelt out in Python.

    >>> sample_index_reference(np.array([5, 5], np.int32), np.array([0, 1], np.int32), 4, 1, 2).tolist()
    [[0, 0], [0, 4], [1, 3]]
"""

from __future__ import annotations

import numpy as np


def sample_index_reference(
    sequence_lengths: np.ndarray,
    document_index: np.ndarray,
    sequence_length: int,
    extra_tokens: int,
    num_samples: int,
) -> np.ndarray:
    """Where each sample starts, from the cumulative token count of the document index.

    Sample i starts at global token i * L of the concatenated epochs. Row i (i >= 1) is the sequence
    holding the last token sample i - 1 reads (global token i * L + extra - 1), and the offset of
    token i * L inside it; rows past the end of the tokens are (D - 1, last length - extra).

    Args:
        sequence_lengths: int32 [S], tokens per sequence.
        document_index: int [D], sequence ids in reading order.
        sequence_length: tokens per sample L.
        extra_tokens: 0 or 1, tokens read beyond L per sample.
        num_samples: n, the number of samples (rows - 1).

    Returns:
        int64 [n + 1, 2]: (position in `document_index`, token offset).
    """
    lengths = sequence_lengths[document_index].astype(np.int64)
    ends = np.cumsum(lengths)  # ends[p] = tokens up to and including position p
    starts = ends - lengths
    targets = np.arange(1, num_samples + 1, dtype=np.int64) * sequence_length + extra_tokens
    positions = np.searchsorted(ends, targets, side="left")
    out = np.zeros((num_samples + 1, 2), dtype=np.int64)
    inside = positions < len(document_index)
    out[1:, 0][inside] = positions[inside]
    out[1:, 1][inside] = targets[inside] - extra_tokens - starts[positions[inside]]
    out[1:, 0][~inside] = len(document_index) - 1
    out[1:, 1][~inside] = lengths[-1] - extra_tokens if len(lengths) else 0
    return out


def _greedy_reference(weights: list[float], limits: list[int], size: int) -> tuple[np.ndarray, np.ndarray]:
    """Sample i goes to the open dataset (weight > 0, count below its limit; -1 = none) with the
    largest `weight * max(i, 1) - count`, the first one on ties."""
    counts = [0] * len(weights)
    dataset_index = np.empty(size, np.int64)
    dataset_sample_index = np.empty(size, np.int64)
    for i in range(size):
        scale = max(float(i), 1.0)
        open_ids = [d for d, w in enumerate(weights) if w > 0 and counts[d] != limits[d]]
        errors = [weights[d] * scale - counts[d] for d in open_ids]
        best = open_ids[errors.index(max(errors))]  # index() finds the first maximum
        dataset_index[i] = best
        dataset_sample_index[i] = counts[best]
        counts[best] += 1
    return dataset_index, dataset_sample_index


def blending_indices_reference(weights: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """Greedy weighted interleaving of `size` samples; weight-0 datasets are never chosen.

    Returns:
        (dataset ids int64 [size], sample id inside the dataset int64 [size]).
    """
    return _greedy_reference([float(w) for w in weights], [-1] * len(weights), size)


def exhaustive_blending_indices_reference(sizes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Greedy interleaving, weights sizes / sum(sizes), that uses every sample of every dataset once.

    Returns:
        (dataset ids int64 [sum(sizes)], sample id inside the dataset int64 [sum(sizes)]).
    """
    sizes = [int(s) for s in sizes]
    total = sum(sizes)
    return _greedy_reference([s / float(total) for s in sizes] if total else [], sizes, total)
