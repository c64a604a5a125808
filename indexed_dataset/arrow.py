"""Hugging Face `datasets` Arrow shards: the `Dataset.save_to_disk` layout, written with pyarrow alone.

    with ArrowWriter("out/corpus_arrow", np.uint16) as writer:
        writer.add_documents(tokens, sequence_lengths, document_sequence_counts, fields={"id": ids})
    datasets.load_from_disk("out/corpus_arrow")        # memory-mapped, nothing copied
    ArrowReader("out/corpus_arrow").document_indices   # our own reader

The directory holds:

    data-00000-of-00002.arrow   Arrow IPC *stream* format (starts FF FF FF FF, no "ARROW1" magic)
    data-00001-of-00002.arrow   shards rotate past `shard_size` bytes; renamed at the end, when the
                                shard count in the names is known
    state.json                  {"_data_files": [{"filename": ...}], "_fingerprint": hex, ...}
    dataset_info.json           {"features": ...}; written last, through a temporary name

One row per document: `input_ids` is list<int32> (list<int64> for 64-bit token dtypes) with the
feature spelled `Sequence`, which datasets 2.19, 3.6 and 5.x all read (5.x's own spelling, `List`, is
refused by 3.x and 2.x). Optional columns: `sequence_lengths` list<int32> (sentence boundaries) and
scalar pass-through fields. The token dtype goes in the schema metadata (`tokenmill`), so a
round trip gives back the same dtype.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from .errors import ShardFormatError, TokenmillError
from .names import ARROW_STATE_FILE
from .path_rules import file_inside
from .protocol import DocumentBatch, TokenWriter
from .rows import (
    FIELD_TYPES,
    RowDocumentsReader,
    check_document_batch,
    check_fields,
    check_row_layout,
    infer_field_types,
    row_structure,
)

# save_to_disk's default `max_shard_size` is 500 MB.
DEFAULT_SHARD_SIZE = 500 * 10**6
# Rows per record batch: datasets' own `writer_batch_size` default.
DEFAULT_BATCH_ROWS = 1000
INFO_FILE = "dataset_info.json"
TOKENS_COLUMN = "input_ids"
LENGTHS_COLUMN = "sequence_lengths"
HF_METADATA_KEY = b"huggingface"
TOKENMILL_METADATA_KEY = b"tokenmill"
_LIST_OFFSET_MAX = np.iinfo(np.int32).max
_ARROW_FIELD_TYPES = dict(zip(FIELD_TYPES, (pa.int32(), pa.int64(), pa.float32(), pa.float64(), pa.string())))


def data_file_name(index: int, count: int) -> str:
    """`data-00000-of-00002.arrow`: save_to_disk's shard name."""
    return f"data-{index:05d}-of-{count:05d}.arrow"


def _numeric_array(values: np.ndarray, value_type: pa.DataType) -> pa.Array:
    """A zero-copy Arrow array over a numpy buffer (`pa.array` would import pandas: 0.3 s once)."""
    values = np.ascontiguousarray(values, dtype=value_type.to_pandas_dtype())
    return pa.Array.from_buffers(value_type, len(values), [None, pa.py_buffer(values)])


def _list_array(offsets: np.ndarray, values: np.ndarray, value_type: pa.DataType) -> pa.ListArray:
    """Rows `values[offsets[i]:offsets[i + 1]]` as a list array (offsets rebased to 0, int32)."""
    first, last = int(offsets[0]), int(offsets[-1])
    return pa.ListArray.from_arrays(
        _numeric_array(offsets - first, pa.int32()), _numeric_array(values[first:last], value_type)
    )


def _sequence_feature(value_dtype: str) -> dict:
    return {"feature": {"dtype": value_dtype, "_type": "Value"}, "_type": "Sequence"}


def _write_json(path: str, content: dict) -> None:
    """Write JSON through a temporary name, so the final name only ever holds a whole file."""
    temporary = path + ".tmp"
    with open(temporary, "w", encoding="utf-8") as f:
        json.dump(content, f, indent=2, sort_keys=True)
    os.replace(temporary, path)


class ArrowWriter(TokenWriter):
    """Streams documents into a `save_to_disk`-style directory.

    Args:
        path: output directory (created; it must not already hold files).
        dtype: token dtype; every id is range-checked against it.
        shard_size: bytes after which the next record batch starts a new shard.
        store_sequence_lengths: add a `sequence_lengths` column (needed when a document has several
            sequences).
        field_types: scalar pass-through fields, name -> one of `rows.FIELD_TYPES`; None: taken from
            the first `add_documents(..., fields=...)` call.
        batch_rows: documents per Arrow record batch.

    Raises:
        TokenmillError: the directory already holds files.
    """

    def __init__(
        self,
        path: str,
        dtype: np.dtype | type,
        *,
        shard_size: int = DEFAULT_SHARD_SIZE,
        store_sequence_lengths: bool = False,
        field_types: Mapping[str, str] | None = None,
        batch_rows: int = DEFAULT_BATCH_ROWS,
    ) -> None:
        self.path = str(path)
        self.dtype = np.dtype(dtype)
        if self.dtype.kind not in "iu":
            raise ValueError(f"{self.path}: token dtype must be an integer type, got {self.dtype}")
        if shard_size <= 0 or batch_rows <= 0:
            raise ValueError(f"{self.path}: shard_size and batch_rows must be positive")
        if os.path.isdir(self.path) and os.listdir(self.path):
            raise TokenmillError(f"{self.path}: output directory is not empty")
        self._created_folder = not os.path.isdir(self.path)
        os.makedirs(self.path, exist_ok=True)
        limits = np.iinfo(self.dtype)
        wide = limits.max > np.iinfo(np.int32).max or limits.min < np.iinfo(np.int32).min
        self._value_type = pa.int64() if wide else pa.int32()
        self.shard_size = shard_size
        self.store_sequence_lengths = store_sequence_lengths
        self.batch_rows = batch_rows
        self.field_types = dict(field_types) if field_types is not None else None
        unknown = [f"{n}: {k!r}" for n, k in (self.field_types or {}).items() if k not in FIELD_TYPES]
        if unknown:
            raise ValueError(f"{self.path}: field types must be one of {FIELD_TYPES}, got {', '.join(unknown)}")
        self.num_documents = 0
        self._pending: list[tuple[DocumentBatch, Mapping[str, Sequence[Any]]]] = []
        self._pending_rows = 0
        self._schema: pa.Schema | None = None
        self._shard_paths: list[str] = []
        self._sink: pa.OSFile | None = None
        self._stream: pa.ipc.RecordBatchStreamWriter | None = None

    # ---------------------------------------------------------------------------------------- schema
    def _features(self) -> dict:
        value_dtype = "int64" if self._value_type == pa.int64() else "int32"
        features = {TOKENS_COLUMN: _sequence_feature(value_dtype)}
        if self.store_sequence_lengths:
            features[LENGTHS_COLUMN] = _sequence_feature("int32")
        for name, kind in self.field_types.items():
            features[name] = {"dtype": kind, "_type": "Value"}
        return features

    def _build_schema(self) -> pa.Schema:
        columns = [pa.field(TOKENS_COLUMN, pa.list_(self._value_type))]
        if self.store_sequence_lengths:
            columns.append(pa.field(LENGTHS_COLUMN, pa.list_(pa.int32())))
        for name, kind in self.field_types.items():
            columns.append(pa.field(name, _ARROW_FIELD_TYPES[kind]))
        metadata = {
            HF_METADATA_KEY: json.dumps({"info": {"features": self._features()}}),
            TOKENMILL_METADATA_KEY: json.dumps({"dtype": self.dtype.name}),
        }
        return pa.schema(columns, metadata=metadata)

    # ---------------------------------------------------------------------------------------- adding
    def add_documents(
        self,
        tokens: np.ndarray,
        sequence_lengths: np.ndarray,
        document_sequence_counts: np.ndarray,
        fields: Mapping[str, Sequence[Any]] | None = None,
    ) -> None:
        """Append many documents (the `IndexedDatasetWriter.add_documents` layout).

        Args:
            tokens: [N] ids of every sequence, concatenated.
            sequence_lengths: [S] tokens per sequence.
            document_sequence_counts: [D] sequences per document (0 = an empty document).
            fields: optional scalar values per document, name -> [D] values.
        """
        self._check_open()
        batch = check_document_batch(
            tokens, sequence_lengths, document_sequence_counts, self.dtype, self.path, self.num_documents
        )
        check_row_layout(batch, self.store_sequence_lengths, self.path, self.num_documents)
        if self.field_types is None:
            self.field_types = infer_field_types(fields) if fields else {}
        check_fields(fields, self.field_types, batch.num_documents, self.path)
        # Copies: the caller may reuse its buffers once this returns, and pending rows wait for a batch.
        arrays = (batch.tokens, batch.sequence_lengths, batch.document_sequence_counts)
        pending = DocumentBatch(*(np.array(a) for a in arrays))
        self._pending.append((pending, {name: list(values) for name, values in (fields or {}).items()}))
        self._pending_rows += batch.num_documents
        self.num_documents += batch.num_documents
        if self._pending_rows >= self.batch_rows:
            self._flush(final=False)

    def _flush(self, final: bool) -> None:
        """Write the pending documents as record batches of `batch_rows` (the rest waits unless final)."""
        if not self._pending:
            return
        batches = [batch for batch, _ in self._pending]
        tokens = np.concatenate([b.tokens for b in batches])
        lengths = np.concatenate([b.sequence_lengths for b in batches])
        counts = np.concatenate([b.document_sequence_counts for b in batches])
        merged = DocumentBatch(tokens, lengths, counts)
        fields = {
            name: [v for _, values in self._pending for v in values[name]] for name in self.field_types
        }
        document_offsets = merged.document_token_offsets()
        sequence_starts = np.zeros(len(counts) + 1, dtype=np.int64)
        np.cumsum(counts, out=sequence_starts[1:])
        rows = len(counts)
        full = rows if final else rows - rows % self.batch_rows
        for start in range(0, full, self.batch_rows):
            stop = min(start + self.batch_rows, full)
            self._write_record_batch(merged, document_offsets, sequence_starts, fields, start, stop)
        if full == rows:
            self._pending, self._pending_rows = [], 0
        else:
            rest = DocumentBatch(
                tokens[document_offsets[full] :],
                lengths[sequence_starts[full] :],
                counts[full:],
            )
            self._pending = [(rest, {name: values[full:] for name, values in fields.items()})]
            self._pending_rows = rows - full

    def _write_record_batch(
        self,
        merged: DocumentBatch,
        document_offsets: np.ndarray,
        sequence_starts: np.ndarray,
        fields: Mapping[str, list],
        start: int,
        stop: int,
    ) -> None:
        if document_offsets[stop] - document_offsets[start] > _LIST_OFFSET_MAX:
            raise TokenmillError(f"{self.path}: {stop - start} documents hold more than 2**31 tokens")
        columns = [_list_array(document_offsets[start : stop + 1], merged.tokens, self._value_type)]
        if self.store_sequence_lengths:
            columns.append(_list_array(sequence_starts[start : stop + 1], merged.sequence_lengths, pa.int32()))
        for name, kind in self.field_types.items():
            columns.append(pa.array(fields[name][start:stop], type=_ARROW_FIELD_TYPES[kind]))
        if self._schema is None:
            self._schema = self._build_schema()
        self._write(pa.RecordBatch.from_arrays(columns, schema=self._schema))

    def _write(self, record_batch: pa.RecordBatch) -> None:
        if self._stream is None:
            shard = os.path.join(self.path, f".data-{len(self._shard_paths):05d}.arrow.tmp")
            self._shard_paths.append(shard)
            self._sink = pa.OSFile(shard, "wb")
            self._stream = pa.ipc.new_stream(self._sink, self._schema)
        self._stream.write_batch(record_batch)
        if self._sink.tell() >= self.shard_size:
            self._close_shard()

    def _close_shard(self) -> None:
        self._stream.close()
        self._sink.close()
        self._stream = self._sink = None

    # ------------------------------------------------------------------------------------- finishing
    def _finish(self) -> None:
        """Write the last batch, name the shards `data-i-of-n.arrow`, then `state.json`, then
        `dataset_info.json` (last: until it exists, `load_from_disk` refuses the directory)."""
        if self.field_types is None:
            self.field_types = {}
        self._flush(final=True)
        if self._schema is None:
            self._schema = self._build_schema()
        if not self._shard_paths:  # no documents: one shard holding the schema only, as datasets does
            self._write_empty_shard()
        if self._stream is not None:
            self._close_shard()
        names = [data_file_name(i, len(self._shard_paths)) for i in range(len(self._shard_paths))]
        for temporary, name in zip(self._shard_paths, names):
            os.replace(temporary, os.path.join(self.path, name))
        self._shard_paths = []
        _write_json(os.path.join(self.path, ARROW_STATE_FILE), self._state(names))
        info = {"citation": "", "description": "", "features": self._features(), "homepage": "", "license": ""}
        _write_json(os.path.join(self.path, INFO_FILE), info)

    def _write_empty_shard(self) -> None:
        shard = os.path.join(self.path, ".data-00000.arrow.tmp")
        self._shard_paths.append(shard)
        with pa.OSFile(shard, "wb") as sink, pa.ipc.new_stream(sink, self._schema):
            pass

    def _state(self, names: list[str]) -> dict:
        # Any hex string is a valid fingerprint; a digest of what was written keeps output deterministic.
        digest = hashlib.sha256(str(self._schema).encode())
        for name in names:
            digest.update(f"{name}:{os.path.getsize(os.path.join(self.path, name))}".encode())
        return {
            "_data_files": [{"filename": name} for name in names],
            "_fingerprint": digest.hexdigest()[:16],
            "_format_columns": None,
            "_format_kwargs": {},
            "_format_type": None,
            "_output_all_columns": False,
            "_split": None,
        }

    def _discard(self) -> None:
        if self._stream is not None:
            # Closing writes the stream's end, which fails again on a full disk: remove the files regardless.
            with contextlib.suppress(OSError):
                self._close_shard()
        for temporary in self._shard_paths:
            if os.path.exists(temporary):
                os.remove(temporary)
        # A folder this writer made must not outlive an aborted write: an empty output looks like a result.
        if self._created_folder and os.path.isdir(self.path) and not os.listdir(self.path):
            os.rmdir(self.path)


def _open_table(path: str) -> pa.Table:
    """Memory-map one `.arrow` file (IPC stream as datasets writes it, or IPC file format) and check it
    fully (list offsets in bounds, no bytes after the end of the stream).

    Raises:
        ShardFormatError: naming the file; pyarrow's own messages ("Invalid flatbuffers message") do not.
    """
    if not os.path.isfile(path):
        raise ShardFormatError(f"{path}: no such file")
    try:
        source = pa.memory_map(path)
        if source.read(6) == b"ARROW1":
            source.seek(0)
            table = pa.ipc.open_file(source).read_all()
        else:
            source.seek(0)
            table = pa.ipc.open_stream(source).read_all()
            trailing = source.size() - source.tell()
            if trailing:
                raise ShardFormatError(f"{path}: {trailing} bytes after the end of the Arrow stream "
                                       f"(offset {source.tell()})")
        # The IPC reader trusts the buffers; a damaged offset would otherwise read outside them later.
        table.validate(full=True)
    except (pa.ArrowException, OSError) as error:
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise ShardFormatError(f"{path}: not a readable Arrow IPC file ({reason})") from None
    return table


def saved_dataset_files(folder: str) -> list[str]:
    """The data files of a `save_to_disk` folder, as its `state.json` lists them (in order), never by
    the names in the folder: a stale extra `data-*.arrow` is not part of the dataset.

    Raises:
        ShardFormatError: the state file is unreadable; its list is missing, empty or not made of
            names; an entry is not a file inside the folder (`..`, an absolute path, a link leading
            out) or is missing. The message names `state.json` and the entry.
    """
    state_path = os.path.join(folder, ARROW_STATE_FILE)
    try:
        with open(state_path, encoding="utf-8") as f:
            entries = json.load(f)["_data_files"]
        names = [entry["filename"] for entry in entries]
    except (OSError, ValueError, KeyError, TypeError, RecursionError) as error:
        raise ShardFormatError(f"{state_path}: cannot read the data file list ({error})") from None
    if not names:
        raise ShardFormatError(f"{state_path}: _data_files lists no data file")
    paths = []
    for number, name in enumerate(names):
        entry = f"_data_files[{number}]"
        path = file_inside(folder, name, state_path, entry=entry)
        if not os.path.isfile(path):
            raise ShardFormatError(f"{state_path}: {entry} names {name!r}, which is missing from {folder}")
        paths.append(path)
    return paths


class ArrowReader(RowDocumentsReader):
    """Reads an Arrow token dataset (ours, or any `save_to_disk` directory with an integer-list
    `input_ids` column) through memory maps.

    Args:
        path: a `save_to_disk` directory or one `.arrow` file.

    Raises:
        ShardFormatError: a file is missing or damaged, or there is no integer-list `input_ids` column.
    """

    def __init__(self, path: str) -> None:
        self.path = str(path)
        if os.path.isdir(self.path):
            files = saved_dataset_files(self.path)
        else:
            files = [self.path]
        self.paths = files
        """The `.arrow` data files, in order."""
        tables = [_open_table(file) for file in files]
        try:
            self._table = pa.concat_tables(tables) if len(tables) > 1 else tables[0]
        except pa.ArrowInvalid as error:
            raise ShardFormatError(f"{self.path}: shards have different schemas ({error})") from None
        schema = self._table.schema
        column_type = schema.field(TOKENS_COLUMN).type if TOKENS_COLUMN in schema.names else None
        is_list = column_type is not None and (pa.types.is_list(column_type) or pa.types.is_large_list(column_type))
        if not is_list or not pa.types.is_integer(column_type.value_type):
            raise ShardFormatError(f"{self.path}: no list-of-integers column {TOKENS_COLUMN!r} (got {column_type})")
        self.dtype = self._token_dtype(schema, column_type.value_type)
        self.field_names = [n for n in schema.names if n not in (TOKENS_COLUMN, LENGTHS_COLUMN)]
        row_tokens = self._row_counts(TOKENS_COLUMN)
        if LENGTHS_COLUMN in schema.names:
            lengths_type = schema.field(LENGTHS_COLUMN).type
            if not pa.types.is_list(lengths_type) or not pa.types.is_integer(lengths_type.value_type):
                raise ShardFormatError(f"{self.path}: column {LENGTHS_COLUMN!r} is {lengths_type}, not a list of integers")
            stored = self._table.column(LENGTHS_COLUMN)
            lengths = np.concatenate([np.zeros(0, np.int32)] + [c.flatten().to_numpy() for c in stored.chunks])
            self.sequence_lengths, self.document_indices = row_structure(
                self.path, row_tokens, lengths, self._row_counts(LENGTHS_COLUMN)
            )
        else:
            self.sequence_lengths, self.document_indices = row_structure(self.path, row_tokens, None, None)
        self._build_offsets()
        if self.num_tokens != int(row_tokens.sum()):
            raise ShardFormatError(f"{self.path}: the {LENGTHS_COLUMN} column does not add up to the tokens")

    def _token_dtype(self, schema: pa.Schema, value_type: pa.DataType) -> np.dtype:
        """The token dtype recorded in our schema metadata, else the column's value type."""
        try:
            metadata = json.loads((schema.metadata or {}).get(TOKENMILL_METADATA_KEY, b"{}"))
            dtype = np.dtype(metadata.get("dtype", value_type.to_pandas_dtype()))
        except (ValueError, TypeError, AttributeError, RecursionError) as error:
            raise ShardFormatError(f"{self.path}: unreadable token dtype in the schema metadata ({error})") from None
        if dtype.kind not in "iu":
            raise ShardFormatError(f"{self.path}: token dtype {dtype} in the schema metadata is not an integer type")
        return dtype

    def _row_counts(self, column: str) -> np.ndarray:
        chunks = self._table.column(column).chunks
        if self._table.column(column).null_count or any(chunk.values.null_count for chunk in chunks):
            raise ShardFormatError(f"{self.path}: column {column!r} has null rows or null values")
        counts = [np.diff(chunk.offsets.to_numpy()).astype(np.int64) for chunk in chunks]
        return np.concatenate([np.zeros(0, np.int64)] + counts)

    @property
    def table(self) -> pa.Table:
        """The memory-mapped Arrow table (one row per document)."""
        return self._table

    def field_values(self, name: str, first: int = 0, last: int | None = None) -> list:
        """The values of a pass-through field for documents [first, last) (default: all), one per document."""
        last = self._table.num_rows if last is None else last
        return self._table.column(name).slice(first, last - first).to_pylist()

    def read_rows(self, first: int, last: int) -> np.ndarray:
        pieces = [np.zeros(0, self.dtype)]
        for chunk in self._table.column(TOKENS_COLUMN).slice(first, last - first).chunks:
            offsets = chunk.offsets.to_numpy()
            pieces.append(chunk.values.to_numpy(zero_copy_only=False)[offsets[0] : offsets[-1]])
        return pieces[1] if len(pieces) == 2 else np.concatenate(pieces)
