"""The writers of one run: every JSON key times every output format, fed the same encoded batches.

Tokenizing happens once; each chunk's documents go to the mmap writer (`IndexedDatasetWriter`), the
Arrow writer and the MindRecord writer of its key (`indexed_dataset.formats.open_writer`). The row
writers are opened before the first chunk, so an existing output or a bad option fails the run
before any work. All writers succeed or fail together: an error anywhere aborts every writer and
removes the outputs this run already finished, so no half set of outputs is left.

With `partitions > 1` the mmap outputs are written as contiguous partial datasets in a scratch
directory and merged at the end (same bytes); the row formats are written in one stream.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import numpy as np
import pyarrow as pa

from indexed_dataset import IndexedDatasetWriter, data_file_path, index_file_path, merge_datasets
from indexed_dataset.formats import MINDRECORD_INDEX_SUFFIX, open_writer

from .config import PreprocessConfig
from .documents import EncodedChunk
from .errors import InputError


def remove_output(fmt: str, path: str, mindrecord_shards: int = 1) -> None:
    """Delete an output of format `fmt` at `path` if it exists (all its files)."""
    if fmt == "arrow":
        shutil.rmtree(path, ignore_errors=True)
        return
    if fmt == "mmap":
        paths = [data_file_path(path), index_file_path(path)]
    else:
        from indexed_dataset.mindrecord import shard_paths

        paths = [p + suffix for p in shard_paths(path, mindrecord_shards) for suffix in ("", MINDRECORD_INDEX_SUFFIX)]
    for file_path in paths:
        if os.path.exists(file_path):
            os.remove(file_path)


class Outputs:
    """Every output of a run; `write` each chunk, then `finish` (or `abort`).

    Args:
        config: the run (keys, formats and their options, partitions, output names).
        dtype: token dtype of every output.

    Raises:
        TokenmillError: a row-format output already exists.
        ValueError: a bad writer option (shard count, empty-document policy).
    """

    def __init__(self, config: PreprocessConfig, dtype: np.dtype) -> None:
        self.config = config
        self.dtype = dtype
        self.partition = -1
        self.mmap_writers: dict[str, IndexedDatasetWriter] = {}
        self.partials: dict[str, list[str]] = {key: [] for key in config.json_keys}
        self.row_writers: list[tuple[str, str, object]] = []  # (key, format, writer)
        self.field_types: dict[str, pa.DataType] | None = None
        self.finished: list[tuple[str, str]] = []
        self.scratch = None
        try:
            for key in config.json_keys:
                for fmt, path in config.output_paths_of(key).items():
                    if fmt != "mmap":
                        self.row_writers.append((key, fmt, open_writer(fmt, path, dtype, **self._options(fmt))))
            if "mmap" in config.output_formats and config.partitions > 1:
                directory = os.path.dirname(os.path.abspath(config.output_prefix))
                self.scratch = tempfile.mkdtemp(prefix=".tokenmill-partitions-", dir=directory)
        except BaseException:
            self.abort()
            raise

    def _options(self, fmt: str) -> dict:
        # Sentence splitting makes several sequences per document: row formats must store their lengths.
        if fmt == "arrow":
            return {"shard_size": self.config.shard_size, "store_sequence_lengths": self.config.split_sentences}
        return {"num_shards": self.config.mindrecord_shards, "empty_documents": self.config.empty_documents,
                "store_sequence_lengths": self.config.split_sentences}

    def write(self, partition: int, chunk: EncodedChunk) -> None:
        """Append a chunk's documents to every output; `partition` is its mmap partition."""
        if "mmap" in self.config.output_formats and partition != self.partition:
            self._open_partition(partition)
        if not chunk.num_documents:
            return
        fields = self._fields(chunk)
        for key, writer in self.mmap_writers.items():
            column = chunk.columns[key]
            writer.add_documents(column.tokens, column.sequence_lengths, column.document_sequence_counts)
        for key, fmt, writer in self.row_writers:
            column = chunk.columns[key]
            extra = {"fields": fields} if fields and fmt == "arrow" else {}
            writer.add_documents(column.tokens, column.sequence_lengths, column.document_sequence_counts, **extra)

    def _fields(self, chunk: EncodedChunk) -> dict[str, list]:
        """The kept fields as Python values; their types must stay those of the first documents."""
        types = {name: values.type for name, values in chunk.fields.items()}
        if self.field_types is None:
            self.field_types = types
        for name, kind in types.items():
            if kind != self.field_types[name]:
                raise InputError(f"{chunk.source}:{chunk.first_line}: field {name!r} holds {kind} values, "
                                 f"earlier documents held {self.field_types[name]}")
        return {name: values.to_pylist() for name, values in chunk.fields.items()}

    def _open_partition(self, partition: int) -> None:
        self._finalize_mmap_writers()
        self.partition = partition
        for key in self.config.json_keys:
            final = self.config.output_prefix_of(key)
            prefix = final if self.scratch is None else os.path.join(self.scratch, f"{partition:05d}_{key}")
            self.partials[key].append(prefix)
            self.mmap_writers[key] = IndexedDatasetWriter(prefix, self.dtype)

    def _finalize_mmap_writers(self) -> None:
        while self.mmap_writers:
            key, writer = self.mmap_writers.popitem()
            writer.finalize()
            if self.scratch is None:
                self.finished.append(("mmap", self.config.output_prefix_of(key)))

    def finish(self) -> None:
        """Finish every output; on any failure, nothing of this run is left."""
        try:
            if "mmap" in self.config.output_formats:
                if self.partition < 0:  # no documents at all: still write (empty) outputs
                    self._open_partition(0)
                self._finalize_mmap_writers()
                if self.scratch is not None:
                    for key, prefixes in self.partials.items():
                        merge_datasets(prefixes, self.config.output_prefix_of(key))
                        self.finished.append(("mmap", self.config.output_prefix_of(key)))
            while self.row_writers:
                _, fmt, writer = self.row_writers.pop(0)
                writer.finalize()
                self.finished.append((fmt, writer.path))
        except BaseException:
            self.abort()
            raise
        self._remove_scratch()

    def abort(self) -> None:
        """Drop every writer's temporaries and every output this run already finished."""
        while self.mmap_writers:
            self.mmap_writers.popitem()[1].abort()
        while self.row_writers:
            self.row_writers.pop()[2].abort()
        while self.finished:
            fmt, path = self.finished.pop()
            remove_output(fmt, path, self.config.mindrecord_shards)
        self._remove_scratch()

    def _remove_scratch(self) -> None:
        if self.scratch is not None:
            shutil.rmtree(self.scratch, ignore_errors=True)
            self.scratch = None
