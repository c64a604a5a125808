"""Merging token files: `merge_datasets(["a", "b"], "ab")` reads back as a followed by b.

Same as Megatron's `tools/merge_datasets.py` (lengths concatenated, document indices shifted by the
running sequence count, `.bin` bytes copied verbatim, pointers recomputed), with the order stated by
the caller; `datasets_in_directory` gives Megatron's order for a directory, and finds the Arrow and
MindRecord datasets there too (those are joined by `convert.convert`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from .checksums import CHECKSUM_SUFFIX
from .errors import TokenmillError
from .format import DATA_SUFFIX, INDEX_SUFFIX, data_file_path, index_file_path
from .names import ARROW_STATE_FILE, MINDRECORD_INDEX_SUFFIX, MINDRECORD_SUFFIX, is_mindrecord_name
from .path_rules import refuse_output_over_inputs, refuse_unreplaceable
from .reader import IndexedDataset
from .writer import IndexedDatasetWriter


def datasets_in_directory(directory: str) -> dict[str, list[str]]:
    """The datasets in `directory` by format, each in lexicographic order of its name (Megatron's order
    for the `.bin/.idx` stems).

    mmap: a `.bin/.idx` pair (its prefix); arrow: a `save_to_disk` folder; mindrecord: a MindRecord
    by its name, `name.mindrecord` (one file, or the shards `name.mindrecord0..N-1`, each beside its
    `.db`; they read back in document order). Checksum manifests (`checksums`), hidden entries and other folders (a fanned-out run's
    `_done` markers) are skipped; only formats present are keys.

    Raises:
        TokenmillError: the directory is missing or holds no dataset, a file of another kind, or a stem
            lacking one of its pair.
    """
    if not os.path.isdir(directory):
        raise TokenmillError(f"{directory}: not a directory")
    found: dict[str, list[str]] = {}
    pair_suffixes: dict[str, set[str]] = {}
    for name in sorted(os.listdir(directory)):
        path = os.path.join(directory, name)
        if name.startswith("."):
            continue
        if os.path.isdir(path):
            if os.path.isfile(os.path.join(path, ARROW_STATE_FILE)):
                found.setdefault("arrow", []).append(path)
            continue
        stem, ext = os.path.splitext(name)
        if ext == MINDRECORD_INDEX_SUFFIX and is_mindrecord_name(stem):
            continue  # a MindRecord's index, read through its data file
        if ext == CHECKSUM_SUFFIX:
            continue  # a dataset's checksum manifest, read with the dataset
        if is_mindrecord_name(name):
            dataset = os.path.join(directory, name[: name.rindex(MINDRECORD_SUFFIX) + len(MINDRECORD_SUFFIX)])
            found.setdefault("mindrecord", []).append(dataset)
        elif ext in (DATA_SUFFIX, INDEX_SUFFIX):
            pair_suffixes.setdefault(stem, set()).add(ext)
        else:
            raise TokenmillError(f"{path}: not a .bin or .idx file, an Arrow folder or a .mindrecord")
    for stem, suffixes in pair_suffixes.items():
        missing = {DATA_SUFFIX, INDEX_SUFFIX} - suffixes
        if missing:
            raise TokenmillError(f"{os.path.join(directory, stem)}: missing its {missing.pop()} file")
    if "mindrecord" in found:  # a multi-shard dataset was met once per shard
        found["mindrecord"] = sorted(set(found["mindrecord"]))
    if pair_suffixes:
        found["mmap"] = [os.path.join(directory, stem) for stem in sorted(pair_suffixes)]
    if not found:
        raise TokenmillError(f"{directory}: no datasets to merge (.bin/.idx pairs, Arrow folders, .mindrecord files)")
    return found


def merge_datasets(prefixes: Sequence[str], output_prefix: str) -> None:
    """Concatenate datasets, in the given order, into `output_prefix.bin/.idx`.

    Raises:
        TokenmillError: no inputs, an unreadable or damaged input, inputs of different dtypes (every
            input is opened, which checks its header, arrays and file sizes, before any byte is written),
            or an output file that would overwrite an input or is not a regular file.
    """
    if not prefixes:
        raise TokenmillError("nothing to merge: no input prefixes")
    datasets = [IndexedDataset(prefix) for prefix in prefixes]
    outputs = [data_file_path(output_prefix), index_file_path(output_prefix)]
    refuse_output_over_inputs(outputs, [path for dataset in datasets for path in (dataset.bin_path, dataset.idx_path)])
    for output in outputs:
        refuse_unreplaceable(output)
    dtype = datasets[0].dtype
    for dataset in datasets[1:]:
        if dataset.dtype != dtype:
            raise TokenmillError(
                f"{dataset.idx_path}: dtype {dataset.dtype.name} differs from {datasets[0].idx_path}'s {dtype.name}"
            )
    with IndexedDatasetWriter(output_prefix, dtype) as writer:
        for prefix in prefixes:
            writer.add_index(prefix)
