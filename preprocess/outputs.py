"""The writers of one run: every JSON key times every output format, fed the same encoded batches.

Tokenizing happens once; each chunk's documents go to the mmap writer (`IndexedDatasetWriter`), the
Arrow writer and the MindRecord writer of its key (`indexed_dataset.formats.open_writer`).

Every writer writes into one hidden staging directory beside the outputs
(`.{name}.staging-XXXX.tmp/`, `name` the last component of the run's prefix), so while a run is
going nothing under an output name changes: the previous outputs stay usable. `finalize` finishes
every writer inside it; `publish` then moves each output to its final name, replacing the previous
one. The run's done marker (see `fanout.py`) is removed before `publish` and written after it, so a
set of outputs is complete exactly when its marker exists, and a run killed in between is redone by
the next run of the same command. An error or interruption anywhere aborts every writer and removes
the staging directory and whatever this run already published: no half set of outputs is left, and
no hidden temporary either (a full disk is not left full by our own files).

With `partitions > 1` the mmap outputs are written as contiguous partial datasets inside the staging
directory and merged there at the end (same bytes); the row formats are written in one stream.
"""

from __future__ import annotations

import contextlib
import glob
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator

import numpy as np
import pyarrow as pa

from indexed_dataset import IndexedDatasetWriter, data_file_path, merge_datasets
from indexed_dataset.formats import check_replaceable, open_writer
from indexed_dataset.formats import dataset_files as output_files
from indexed_dataset.checksums import remove_dataset_checksums, write_dataset_checksums
from indexed_dataset.names import mindrecord_files_name
from indexed_dataset.path_rules import refuse_output_over_inputs

from .config import PreprocessConfig
from .documents import EncodedChunk
from .errors import InputError

logger = logging.getLogger(__name__)

STAGING_INFIX = ".staging-"
STAGING_SUFFIX = ".tmp"
# The outputs that get a checksum manifest beside them (`indexed_dataset.checksums`): the formats without
# checksums of their own, where a flipped bit would read as another valid id. (A `.bin/.idx` pair is
# checked by its own structure and sizes, and its folder listing stays Megatron's.)
CHECKSUMMED_FORMATS = ("arrow", "mindrecord")


def staging_glob(part_prefix: str) -> str:
    """The glob pattern (escaped) matching the staging directories of runs with this prefix."""
    directory, name = os.path.split(os.path.abspath(part_prefix))
    return os.path.join(glob.escape(directory), f".{glob.escape(name)}{STAGING_INFIX}*{STAGING_SUFFIX}")


def written_names(config: PreprocessConfig) -> dict[str, dict[str, str]]:
    """Per JSON key, format -> how the run's summary names that output: its path, or for a multi-shard
    MindRecord the files actually written (`x.mindrecord0..3`; no `x.mindrecord` exists then)."""
    return {
        key: {fmt: mindrecord_files_name(path, config.mindrecord_shards) if fmt == "mindrecord" else path
              for fmt, path in config.output_paths_of(key).items()}
        for key in config.json_keys
    }


def remove_output(fmt: str, path: str, mindrecord_shards: int = 1) -> None:
    """Delete an output of format `fmt` at `path` if it exists (all its files, and its checksum manifest)."""
    for file_path in output_files(fmt, path, mindrecord_shards):
        if os.path.isdir(file_path):
            shutil.rmtree(file_path, ignore_errors=True)
        elif os.path.lexists(file_path):
            os.remove(file_path)
    remove_dataset_checksums(path)


def check_outputs(config: PreprocessConfig, inputs: list[str]) -> None:
    """Before anything is removed or written: refuse outputs that would overwrite an input file (an
    Arrow output folder read as the input, a tokenizer file), or what is not an output of ours (a
    directory, link, FIFO at an output's name; an Arrow folder with someone else's files). Outputs
    of an earlier run are replaced (the rerun).

    Raises:
        TokenmillError: naming the path.
    """
    outputs = [file for key in config.json_keys for fmt, path in config.output_paths_of(key).items()
               for file in output_files(fmt, path, config.mindrecord_shards)]
    refuse_output_over_inputs(outputs, [*inputs, *config.tokenizer.files()])
    for key in config.json_keys:
        for fmt, path in config.output_paths_of(key).items():
            check_replaceable(fmt, path, config.mindrecord_shards)


class Outputs:
    """Every output of a run; `write` each chunk, then `finalize` and `publish` (or `abort`).

    Args:
        config: the run (keys, formats and their options, partitions, output names).
        dtype: token dtype of every output.

    Raises:
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
        self.published: list[tuple[str, str]] = []  # (format, final path)
        directory, name = os.path.split(os.path.abspath(config.part_prefix))
        self.staging: str | None = tempfile.mkdtemp(prefix=f".{name}{STAGING_INFIX}", suffix=STAGING_SUFFIX,
                                                    dir=directory)
        try:
            for key in config.json_keys:
                for fmt, path in config.output_paths_of(key).items():
                    if fmt != "mmap":
                        with self._naming(path):
                            writer = open_writer(fmt, self._staged(path), dtype, **self._options(fmt, path))
                        self.row_writers.append((key, fmt, writer))
        except BaseException:
            self.abort()
            raise

    @contextlib.contextmanager
    def _naming(self, final_path: str) -> Iterator[None]:
        """Make an OSError name the output it hit: a full disk raises one with no file name, and a
        file inside the staging directory is shown under its final name."""
        try:
            yield
        except OSError as error:
            if error.errno is None:
                raise
            name = error.filename
            if name is None:
                name = final_path
            elif self.staging is not None and os.path.abspath(str(name)).startswith(self.staging + os.sep):
                relative = os.path.relpath(os.path.abspath(str(name)), self.staging)
                name = os.path.join(os.path.dirname(os.path.abspath(final_path)), relative)
            else:
                raise
            raise OSError(error.errno, error.strerror or os.strerror(error.errno), name) from None

    def _staged(self, final_path: str) -> str:
        """Where an output is written before it is published."""
        return os.path.join(self.staging, os.path.basename(final_path))

    def _options(self, fmt: str, final_path: str) -> dict:
        # Sentence splitting makes several sequences per document: row formats must store their lengths.
        if fmt == "arrow":
            return {"shard_size": self.config.shard_size, "store_sequence_lengths": self.config.split_sentences}
        # The MindRecord writer logs its files: under the names they are published as, not the staging ones.
        return {"num_shards": self.config.mindrecord_shards, "empty_documents": self.config.empty_documents,
                "store_sequence_lengths": self.config.split_sentences, "published_path": final_path}

    def write(self, partition: int, chunk: EncodedChunk) -> None:
        """Append a chunk's documents to every output; `partition` is its mmap partition."""
        if "mmap" in self.config.output_formats and partition != self.partition:
            self._open_partition(partition)
        if not chunk.num_documents:
            return
        fields = self._fields(chunk)
        for key, writer in self.mmap_writers.items():
            column = chunk.columns[key]
            with self._naming(data_file_path(self.config.output_prefix_of(key))):
                writer.add_documents(column.tokens, column.sequence_lengths, column.document_sequence_counts)
        for key, fmt, writer in self.row_writers:
            column = chunk.columns[key]
            extra = {"fields": fields} if fields and fmt == "arrow" else {}
            with self._naming(self.config.output_paths_of(key)[fmt]):
                writer.add_documents(column.tokens, column.sequence_lengths, column.document_sequence_counts,
                                     **extra)

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
            staged = self._staged(self.config.output_prefix_of(key))
            prefix = staged if self.config.partitions == 1 else f"{staged}.partition{partition:05d}"
            self.partials[key].append(prefix)
            with self._naming(self.config.output_prefix_of(key)):
                self.mmap_writers[key] = IndexedDatasetWriter(prefix, self.dtype)

    def _finalize_mmap_writers(self) -> None:
        while self.mmap_writers:
            key, writer = self.mmap_writers.popitem()
            with self._naming(self.config.output_prefix_of(key)):
                writer.finalize()

    def finalize(self) -> None:
        """Finish every output inside the staging directory; on any failure, nothing of this run is left."""
        try:
            if "mmap" in self.config.output_formats:
                if self.partition < 0:  # no documents at all: still write (empty) outputs
                    self._open_partition(0)
                self._finalize_mmap_writers()
                if self.config.partitions > 1:
                    for key, prefixes in self.partials.items():
                        final = self.config.output_prefix_of(key)
                        with self._naming(final):
                            merge_datasets(prefixes, self._staged(final))
            while self.row_writers:
                key, fmt, writer = self.row_writers.pop(0)
                with self._naming(self.config.output_paths_of(key)[fmt]):
                    writer.finalize()
        except BaseException:
            self.abort()
            raise

    def publish(self) -> None:
        """Move every finished output to its final name (replacing the previous one), then drop the
        staging directory. On failure, the outputs this run already moved are removed too."""
        try:
            for key in self.config.json_keys:
                for fmt, final in self.config.output_paths_of(key).items():
                    remove_output(fmt, final, self.config.mindrecord_shards)
                    self.published.append((fmt, final))
                    shards = self.config.mindrecord_shards
                    for staged, target in zip(output_files(fmt, self._staged(final), shards),
                                              output_files(fmt, final, shards)):
                        with self._naming(target):
                            os.replace(staged, target)
                    if fmt in CHECKSUMMED_FORMATS:
                        with self._naming(final):
                            write_dataset_checksums(final, output_files(fmt, final, shards))
        except BaseException:
            self.abort()
            raise
        self._remove_staging()

    def abort(self) -> None:
        """Drop every writer, the staging directory and every output this run already published.

        Never raises OSError: it runs while another error (a full disk, an interruption) is on its way
        up, and must remove everything it can.
        """
        writers = [*self.mmap_writers.values(), *(writer for _, _, writer in self.row_writers)]
        self.mmap_writers, self.row_writers = {}, []
        for writer in writers:
            try:
                writer.abort()
            except OSError as error:  # e.g. flushing a buffer on a full disk; the staging folder goes below
                logger.debug("%s: abort: %s", writer.path, error)
        while self.published:
            fmt, path = self.published.pop()
            with contextlib.suppress(OSError):
                remove_output(fmt, path, self.config.mindrecord_shards)
        self._remove_staging()

    def _remove_staging(self) -> None:
        if self.staging is not None:
            shutil.rmtree(self.staging, ignore_errors=True)
            self.staging = None
