"""Split strings and blend lists, parsed exactly as megatron-core does.

    >>> parse_split("949,50,1")
    [0.949, 0.05, 0.001]
    >>> split_ranges("90,10,0", 232)
    [(0, 209), (209, 232), None]
    >>> parse_blend("0.3 data/a 0.7 data/b")
    (['data/a', 'data/b'], [0.3, 0.7])

A split covers a contiguous, unshuffled range of sequence ids (GPT datasets split by sequence, not by
document). The float arithmetic (normalise in float64, cumulative sums left to right, Python's
round-half-even on `fraction * N`) is Megatron's, so range boundaries agree to the sequence.
"""

from __future__ import annotations

import re
from typing import Optional, Sequence

import numpy as np

from .errors import BlendFormatError, SplitFormatError

SPLIT_NAMES = ("train", "valid", "test")
"""The three splits, in the order of split strings, `sizes` and `blend_per_split`."""

DEFAULT_SPLIT = "969,30,1"
"""Megatron-LM's `--split` default: the one default of `train`, `build-indices` and `inspect-index`."""

_SPLIT_NUMBER = re.compile(r"[.0-9]+")
"""Megatron extracts the numbers of a split string with this pattern (any separator works)."""

_SPLIT_SEPARATORS = re.compile(r"[\s,/:;]+")
"""What may stand between the numbers. Anything else ("1,2,x", "inf,1,1", "1e3") Megatron's pattern would
silently drop or cut apart, so it is refused."""

SplitBookends = Optional[tuple[float, float]]
"""A split's [start, end) fraction of the dataset, or None when the split is empty by construction."""


def normalize_weights(weights: Sequence[float]) -> list[float]:
    """Weights divided by their sum, in float64 as Megatron's `normalize` (bit-identical results).

    Raises:
        BlendFormatError: a weight is negative or not finite, or all are zero.
    """
    array = np.asarray(weights, dtype=np.float64)
    if array.ndim != 1 or not np.all(np.isfinite(array)) or np.any(array < 0):
        raise BlendFormatError(f"weights must be finite and >= 0, got {list(weights)}")
    total = np.sum(array)
    if total <= 0:
        raise BlendFormatError(f"weights must not all be zero, got {list(weights)}")
    return (array / total).tolist()


def parse_split(split: str) -> list[float]:
    """The three normalised split fractions of a split string such as "949,50,1" or "99/1".

    Missing trailing numbers are zero ("99,1" = "99,1,0").

    Raises:
        SplitFormatError: no numbers, more than three, a malformed number or a word that is not a number
            ("x", "inf", "nan"), or all zero.
    """
    words = [word for word in _SPLIT_SEPARATORS.split(split) if word]
    not_numbers = [word for word in words if not _SPLIT_NUMBER.fullmatch(word)]
    if not_numbers:
        raise SplitFormatError(f"split {split!r}: {not_numbers[0]!r} is not a number >= 0")
    try:
        numbers = [float(token) for token in _SPLIT_NUMBER.findall(split)]
    except ValueError:
        raise SplitFormatError(f"split {split!r}: malformed number") from None
    if not numbers or len(numbers) > len(SPLIT_NAMES):
        raise SplitFormatError(f"split {split!r}: expected 1 to 3 numbers such as '949,50,1'")
    numbers += [0.0] * (len(SPLIT_NAMES) - len(numbers))
    if sum(numbers) <= 0:
        raise SplitFormatError(f"split {split!r}: the numbers must not all be zero")
    return normalize_weights(numbers)


def check_split_sizes(split: str, sizes: Sequence[Optional[int]]) -> None:
    """Refuse sample counts (train, valid, test; None: one epoch) asked of a split that ``split`` leaves empty:
    they would silently give nothing.

    Raises:
        SplitFormatError: naming the split, its count and the split string.
    """
    for name, fraction, size in zip(SPLIT_NAMES, parse_split(split), sizes):
        if fraction == 0 and size:
            raise SplitFormatError(f"split {split!r} gives the {name} split no data, yet {size} {name} samples "
                                   "are asked for")


def split_bookends(split: str) -> list[SplitBookends]:
    """Each split's [start, end) fraction; None where the fraction is zero ("99,1,0" has no test)."""
    fractions = parse_split(split)
    # Megatron accumulates from 0 left to right in Python floats; the same order gives the same bits.
    edges = [0.0]
    for fraction in fractions:
        edges.append(edges[-1] + fraction)
    return [(start, end) if end > start else None for start, end in zip(edges[:-1], edges[1:])]


def split_ranges(split: str, num_sequences: int) -> list[Optional[tuple[int, int]]]:
    """The [begin, end) sequence ids of each split of a dataset with `num_sequences` sequences.

    A range may be empty (begin == end) even when its fraction is not zero: "949,50,1" of 232
    sequences leaves the test split [232, 232).

    Returns:
        Three entries (train, valid, test): a (begin, end) pair, or None for a zero fraction.
    """
    ranges: list[Optional[tuple[int, int]]] = []
    for bookend in split_bookends(split):
        if bookend is None:
            ranges.append(None)
        else:
            # Python's round() rounds half to even, as Megatron's int(round(fraction * float(N))).
            ranges.append(tuple(int(round(edge * float(num_sequences))) for edge in bookend))
    return ranges


def parse_blend(words: Sequence[str] | str) -> tuple[list[str], Optional[list[float]]]:
    """Prefixes and raw weights of a blend: "a b" (prefixes only) or "0.3 a 0.7 b" (weight, prefix pairs).

    As in Megatron, an odd number of words, or an even number whose every other word is not a
    number, means prefixes only (weights None). Weights are returned as given, not normalised.

    Raises:
        BlendFormatError: the blend is empty, a weight is negative, or only some of the
            would-be weights are numbers.
    """
    items = words.split() if isinstance(words, str) else [str(word).strip() for word in words]
    if not items:
        raise BlendFormatError("blend: no dataset prefixes given")
    if len(items) % 2 == 1:
        return items, None
    weights: list[Optional[float]] = []
    for word in items[0::2]:
        try:
            weights.append(float(word))
        except ValueError:
            weights.append(None)
    if all(weight is None for weight in weights):
        return items, None
    if any(weight is None for weight in weights):
        raise BlendFormatError(f"blend {' '.join(items)!r}: expected 'weight prefix' pairs or prefixes only")
    if any(weight < 0 for weight in weights):
        raise BlendFormatError(f"blend {' '.join(items)!r}: weights must be >= 0")
    return items[1::2], weights
