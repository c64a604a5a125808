"""The token formats' registry: a dataset's format from its path, and the reader or writer of each format
(Arrow and MindRecord are loaded on first use). What the formats share lives below it: `protocol` (the
document batch), `names` (file naming), `rows` (the row-per-document machinery).

    from indexed_dataset.formats import open_reader, open_writer
    with open_writer("arrow", "out/corpus_arrow", np.uint16) as writer:   # or "mmap", "mindrecord"
        writer.add_documents(tokens, sequence_lengths, document_sequence_counts)
    reader = open_reader("out/corpus_arrow")   # the format is detected from the path
    reader.sequence_lengths, reader.document_indices, reader[0]

Every writer takes `(prefix_or_path, dtype, **options)` and has `add_documents(tokens,
sequence_lengths, document_sequence_counts)`, `add_document(ids, lengths)`, `finalize()`, `abort()`
and the context-manager behaviour of `IndexedDatasetWriter`. Every reader exposes `sequence_lengths`
(int32 [S]), `document_indices` (int64 [D+1]), `len()`, `reader[i]`, `dtype` and `num_tokens`.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from .errors import ShardFormatError, TokenmillError
from .format import data_file_path, index_file_path
from .names import (
    ARROW_FOLDER_SUFFIX,
    ARROW_METADATA_FILES,
    ARROW_OWN_FILE_NAMES,
    ARROW_STATE_FILE,
    MINDRECORD_INDEX_SUFFIX,
    MINDRECORD_SUFFIX,
    is_mindrecord_name,
    shard_paths,
)
from .path_rules import refuse_unreplaceable
from .reader import IndexedDataset
from .writer import IndexedDatasetWriter

FORMATS = ("mmap", "arrow", "mindrecord")


def dataset_path(fmt: str, stem: str) -> str:
    """The path of the dataset of format `fmt` named after `stem` (`x_text_document`): the prefix itself
    for mmap, `stem_arrow` for Arrow, `stem.mindrecord` for MindRecord."""
    suffixes = {"mmap": "", "arrow": ARROW_FOLDER_SUFFIX, "mindrecord": MINDRECORD_SUFFIX}
    if fmt not in suffixes:
        raise ValueError(f"unknown format {fmt!r}; expected one of {', '.join(FORMATS)}")
    return stem + suffixes[fmt]


def dataset_files(fmt: str, path: str, num_shards: int = 1) -> list[str]:
    """The files (for Arrow, the folder) a dataset of format `fmt` at `path` consists of, in the order
    a writer publishes them (the one that makes a reader take the dataset as complete comes last):
    `.bin` then `.idx`; the Arrow folder; each MindRecord `.db` then its data file (`num_shards` of them)."""
    if fmt == "mmap":
        return [data_file_path(path), index_file_path(path)]
    if fmt == "arrow":
        return [path]
    if fmt == "mindrecord":
        return [p + suffix for p in shard_paths(path, num_shards) for suffix in (MINDRECORD_INDEX_SUFFIX, "")]
    raise ValueError(f"unknown format {fmt!r}; expected one of {', '.join(FORMATS)}")


def files_read(fmt: str, reader: Any) -> list[str]:
    """The files an open dataset of format `fmt` is made of (what inspect-index reports, and what no
    output of the same command may overwrite: `path_rules.refuse_output_over_inputs`)."""
    if fmt == "mmap":
        return [reader.bin_path, reader.idx_path]
    if fmt == "mindrecord":
        return [file for path in reader.paths for file in (path, path + MINDRECORD_INDEX_SUFFIX)]
    folder = os.path.isdir(reader.path)
    return list(reader.paths) + ([os.path.join(reader.path, name) for name in ARROW_METADATA_FILES] if folder else [])


def check_replaceable(fmt: str, path: str, num_shards: int = 1) -> None:
    """Refuse to write a dataset over what an earlier run of ours did not leave: a directory, link, FIFO
    or device at a file's name, anything but a folder at the Arrow name, or an Arrow folder holding
    files our writer does not make. (Regular files, and Arrow folders of ours, are replaced: the rerun.)

    Raises:
        TokenmillError: naming the path.
    """
    for file_path in dataset_files(fmt, path, num_shards):
        refuse_unreplaceable(file_path, folder=fmt == "arrow")
    if fmt == "arrow" and os.path.isdir(path):
        foreign = sorted(name for name in os.listdir(path) if not ARROW_OWN_FILE_NAMES.fullmatch(name))
        if foreign:
            raise TokenmillError(f"{path}: output directory is not empty (it holds {foreign[0]!r}, which "
                                 "tokenmill did not write); remove it or choose another output name")


def format_of(path: str) -> str:
    """The format of an existing dataset path: "arrow" (a `save_to_disk` directory or an `.arrow`
    file), "mindrecord" (a `.mindrecord` / `.mindrecordN` file) or "mmap" (a prefix, `.bin` or `.idx`).

    Raises:
        ShardFormatError: the path is none of these.
    """
    path = str(path)
    if os.path.isdir(path):
        if os.path.isfile(os.path.join(path, ARROW_STATE_FILE)):
            return "arrow"
        raise ShardFormatError(f"{path}: a directory without {ARROW_STATE_FILE}, not a saved Arrow dataset")
    if path.endswith(".arrow"):
        return "arrow"
    if is_mindrecord_name(path):
        return "mindrecord"
    return "mmap"


def open_reader(path: str, fmt: str | None = None, mmap_bin: bool = True) -> Any:
    """Open a dataset of any format with its reader (`IndexedDataset` for mmap).

    Args:
        path: the dataset path (see `format_of`).
        fmt: one of `FORMATS`, or None to detect it from the path.
        mmap_bin: mmap format: map the `.bin` (False: plain file reads, `IndexedDataset`'s mmap_bin).
    """
    fmt = fmt or format_of(path)
    if fmt == "mmap":
        return IndexedDataset(path, mmap_bin=mmap_bin)
    if fmt == "arrow":
        from .arrow import ArrowReader

        return ArrowReader(path)
    if fmt == "mindrecord":
        from .mindrecord_reader import MindRecordReader

        return MindRecordReader(path)
    raise ValueError(f"unknown format {fmt!r}; expected one of {', '.join(FORMATS)}")


def open_writer(fmt: str, prefix_or_path: str, dtype: np.dtype | type, **options: Any) -> Any:
    """A streaming writer of format `fmt` (one of `FORMATS`); `options` go to its constructor.

    mmap: `IndexedDatasetWriter` (no options). arrow: `ArrowWriter` (`shard_size`, `store_sequence_lengths`,
    `field_types`). mindrecord: `MindRecordWriter` (`num_shards`, `header_size`, `page_size`,
    `empty_documents`, `store_sequence_lengths`, `field_types`).
    """
    if fmt == "mmap":
        if options:
            raise ValueError(f"the mmap writer takes no options, got {', '.join(sorted(options))}")
        return IndexedDatasetWriter(prefix_or_path, dtype)
    if fmt == "arrow":
        from .arrow import ArrowWriter

        return ArrowWriter(prefix_or_path, dtype, **options)
    if fmt == "mindrecord":
        from .mindrecord import MindRecordWriter

        return MindRecordWriter(prefix_or_path, dtype, **options)
    raise ValueError(f"unknown format {fmt!r}; expected one of {', '.join(FORMATS)}")
