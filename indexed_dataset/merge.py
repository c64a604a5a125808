"""Merging token files: `merge_datasets(["a", "b"], "ab")` reads back as a followed by b.

Same as Megatron's `tools/merge_datasets.py` (lengths concatenated, document indices shifted by the
running sequence count, `.bin` bytes copied verbatim, pointers recomputed), with the order stated by
the caller; `prefixes_in_directory` gives Megatron's order for a directory.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from .errors import TokenmillError
from .format import DATA_SUFFIX, INDEX_SUFFIX
from .reader import IndexedDataset
from .writer import IndexedDatasetWriter


def prefixes_in_directory(directory: str) -> list[str]:
    """The dataset prefixes in `directory`, in lexicographic order of their stems (Megatron's order).

    Raises:
        TokenmillError: the directory is missing or empty, holds a file that is not `.bin`/`.idx`, or a
            stem lacks one of the pair.
    """
    if not os.path.isdir(directory):
        raise TokenmillError(f"{directory}: not a directory")
    suffixes: dict[str, set[str]] = {}
    for name in sorted(os.listdir(directory)):
        path = os.path.join(directory, name)
        if not os.path.isfile(path) or name.startswith("."):
            continue
        stem, ext = os.path.splitext(name)
        if ext not in (DATA_SUFFIX, INDEX_SUFFIX):
            raise TokenmillError(f"{path}: not a .bin or .idx file")
        suffixes.setdefault(stem, set()).add(ext)
    for stem, found in suffixes.items():
        missing = {DATA_SUFFIX, INDEX_SUFFIX} - found
        if missing:
            raise TokenmillError(f"{os.path.join(directory, stem)}: missing its {missing.pop()} file")
    if not suffixes:
        raise TokenmillError(f"{directory}: no .bin/.idx pairs to merge")
    return [os.path.join(directory, stem) for stem in sorted(suffixes)]


def merge_datasets(prefixes: Sequence[str], output_prefix: str) -> None:
    """Concatenate datasets, in the given order, into `output_prefix.bin/.idx`.

    Raises:
        TokenmillError: no inputs, an unreadable input, or inputs of different dtypes (checked on
            every header before any byte is written).
    """
    if not prefixes:
        raise TokenmillError("nothing to merge: no input prefixes")
    datasets = [IndexedDataset(prefix) for prefix in prefixes]
    dtype = datasets[0].dtype
    for dataset in datasets[1:]:
        if dataset.dtype != dtype:
            raise TokenmillError(
                f"{dataset.idx_path}: dtype {dataset.dtype.name} differs from {datasets[0].idx_path}'s {dtype.name}"
            )
    with IndexedDatasetWriter(output_prefix, dtype) as writer:
        for prefix in prefixes:
            writer.add_index(prefix)
