"""Columnar inputs: Parquet, Arrow IPC (file and stream) and `datasets.load_dataset` streams.

Every source is read in pyarrow record batches (never row by row), sliced to about `chunk_bytes`,
and only the needed columns (the keys and the kept fields) are read. A `RecordBatchChunk` goes to a
worker like a chunk of JSON lines; its `parse` checks each key column (a string, or a list of
strings: already-split sentences) and each kept field (a number or a string), and names the first
bad row as `file:row N: reason` (N counts from 0 in the file, as `dataset[N]`).

`--hf-dataset` goes through `datasets.load_dataset(..., streaming=True)` with the Hub switched off:
only the local builders (json, parquet, arrow, text, csv) or a local folder are accepted.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from .chunks import ParsedChunk, TextColumn, field_array
from .errors import InputError

ARROW_FILE_MAGIC = b"ARROW1"
# `datasets` builders that read local files only; anything else would reach for the Hub.
LOCAL_BUILDERS = ("json", "parquet", "arrow", "text", "csv")
_OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
# Rows per batch asked of a `datasets` stream (sliced further to `chunk_bytes`).
HF_BATCH_ROWS = 4096


@dataclass(frozen=True)
class RecordBatchChunk:
    """Consecutive rows of one columnar source.

    Attributes:
        source: the file (or dataset) name.
        first_row: 0-based number of the chunk's first row in the source.
        batch: the rows (only the needed columns).
        disk_offset: estimated input bytes consumed once this chunk was read, over all inputs.
    """

    source: str
    first_row: int
    batch: pa.RecordBatch
    disk_offset: int

    @property
    def num_bytes(self) -> int:
        return self.batch.nbytes

    def __reduce__(self):
        # Pickling a sliced batch would send the whole parent buffers to a worker process: send a
        # compact copy of the rows instead (in-process encoding never pickles, so never copies).
        compact = pa.RecordBatch.from_arrays([pa.concat_arrays([column]) for column in self.batch.columns],
                                             schema=self.batch.schema)
        return RecordBatchChunk, (self.source, self.first_row, compact, self.disk_offset)

    def location(self, row: int) -> str:
        """`file:row N`, for messages."""
        return f"{self.source}:row {row}"

    def parse(self, keys: tuple[str, ...], skip_invalid: bool = False, fields: tuple[str, ...] = ()) -> ParsedChunk:
        """The chunk's documents (see `parse_record_batch`)."""
        return parse_record_batch(self, keys, skip_invalid, fields)


def _text_column(chunk: RecordBatchChunk, name: str, column: pa.Array) -> tuple[TextColumn, np.ndarray]:
    """The key's texts and a bool [R] mask of the rows that are invalid (nulls)."""
    if pa.types.is_dictionary(column.type):  # dictionary-encoded strings (pandas categoricals, parquet)
        column = column.dictionary_decode()
    kind = column.type
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        invalid = column.is_null().to_numpy(zero_copy_only=False)
        return TextColumn(column.cast(pa.large_string())), invalid
    if (pa.types.is_list(kind) or pa.types.is_large_list(kind)) and (
        pa.types.is_string(kind.value_type) or pa.types.is_large_string(kind.value_type)
    ):
        import pyarrow.compute as pc  # here: ~25 ms to import, which JSON-lines runs never need

        invalid = column.is_null().to_numpy(zero_copy_only=False).copy()
        filled = column.fill_null(pa.scalar([], type=kind))
        counts = pc.list_value_length(filled).to_numpy(zero_copy_only=False).astype(np.int64)
        values = filled.flatten()
        null_pieces = np.flatnonzero(values.is_null().to_numpy(zero_copy_only=False))
        if len(null_pieces):
            owner = np.searchsorted(np.cumsum(counts), null_pieces, side="right")
            invalid[owner] = True
        return TextColumn(values.cast(pa.large_string()), counts), invalid
    raise InputError(f"{chunk.location(chunk.first_row)}: column {name!r} holds {kind}, "
                     "expected strings or lists of strings")


def _keep_rows(column: TextColumn, rows: np.ndarray) -> TextColumn:
    """The column restricted to the row numbers `rows` (int64, increasing)."""
    if column.piece_counts is None:
        return TextColumn(column.pieces.take(pa.array(rows)))
    starts = np.zeros(len(column.piece_counts) + 1, dtype=np.int64)
    np.cumsum(column.piece_counts, out=starts[1:])
    counts = column.piece_counts[rows]
    pieces = np.concatenate([np.arange(starts[row], starts[row + 1]) for row in rows]) if len(rows) else rows
    return TextColumn(column.pieces.take(pa.array(pieces, type=pa.int64())), counts)


def parse_record_batch(
    chunk: RecordBatchChunk, keys: tuple[str, ...], skip_invalid: bool = False, fields: tuple[str, ...] = ()
) -> ParsedChunk:
    """The documents of a record batch: one per row.

    Args:
        chunk: the rows.
        keys: text columns; each must hold strings or lists of strings.
        skip_invalid: skip rows with a null text or field (recorded in `skipped`) instead of failing.
        fields: scalar columns passed through (numbers or strings).

    Raises:
        InputError: `file:row N: reason` for a missing column, a column of another type, or a null.
    """
    batch = chunk.batch
    present = set(batch.schema.names)
    for name in (*keys, *fields):
        if name not in present:
            raise InputError(f"{chunk.location(chunk.first_row)}: missing column {name!r} "
                             f"(columns: {', '.join(batch.schema.names)})")
    invalid = np.zeros(batch.num_rows, dtype=bool)
    reasons: dict[int, str] = {}
    columns = {}
    for key in keys:
        columns[key], bad = _text_column(chunk, key, batch.column(key))
        for row in np.flatnonzero(bad & ~invalid)[:1]:
            reasons[int(row)] = f"key {key!r} holds null"
        invalid |= bad
    values = {}
    for name in fields:
        try:
            values[name] = field_array(batch.column(name), name)
        except ValueError as error:
            raise InputError(f"{chunk.location(chunk.first_row)}: {error}") from None
        bad = values[name].is_null().to_numpy(zero_copy_only=False)
        for row in np.flatnonzero(bad & ~invalid)[:1]:
            reasons[int(row)] = f"field {name!r} holds null"
        invalid |= bad
    rows = np.arange(chunk.first_row, chunk.first_row + batch.num_rows, dtype=np.int64)
    if not invalid.any():
        return ParsedChunk(chunk.source, rows, columns, fields=values)
    first_bad = int(np.flatnonzero(invalid)[0])
    if not skip_invalid:
        raise InputError(f"{chunk.location(chunk.first_row + first_bad)}: {reasons[first_bad]}")
    keep = np.flatnonzero(~invalid)
    skipped = [(int(chunk.first_row + row), reasons.get(int(row), "null value")) for row in np.flatnonzero(invalid)]
    return ParsedChunk(
        chunk.source,
        rows[keep],
        {key: _keep_rows(column, keep) for key, column in columns.items()},
        skipped,
        fields={name: array.take(pa.array(keep)) for name, array in values.items()},
    )


def _select(source: str, available: Sequence[str], needed: Sequence[str]) -> list[str]:
    """`needed`, after checking the source has every one of them.

    Raises:
        InputError: `source:row 0: missing column 'x' (columns: ...)`.
    """
    for name in needed:
        if name not in available:
            raise InputError(f"{source}:row 0: missing column {name!r} (columns: {', '.join(available)})")
    return list(needed)


def _sliced(source: str, batches: Iterator[pa.RecordBatch], chunk_bytes: int, consumed_before: int,
            disk_bytes: int, total_rows: int | None) -> Iterator[RecordBatchChunk]:
    """Batches cut to about `chunk_bytes`, numbered by row, with an estimated disk offset."""
    first_row = 0
    for batch in batches:
        if not batch.num_rows:
            continue
        rows_per_chunk = max(1, chunk_bytes * batch.num_rows // max(batch.nbytes, 1))
        for start in range(0, batch.num_rows, rows_per_chunk):
            piece = batch.slice(start, rows_per_chunk)
            done = first_row + start + piece.num_rows
            offset = disk_bytes * done // total_rows if total_rows else 0
            yield RecordBatchChunk(source, first_row + start, piece, consumed_before + offset)
        first_row += batch.num_rows


def parquet_chunks(
    path: str, columns: Sequence[str], chunk_bytes: int, consumed_before: int
) -> Iterator[RecordBatchChunk]:
    """The rows of a Parquet file, reading only `columns` (each must exist)."""
    import pyarrow.parquet as pq  # here: ~10 ms to import, which other inputs never need

    try:
        parquet = pq.ParquetFile(path)
        needed = _select(path, parquet.schema_arrow.names, columns)
        metadata = parquet.metadata
        unpacked = sum(metadata.row_group(i).total_byte_size for i in range(metadata.num_row_groups))
        rows = max(1, chunk_bytes * metadata.num_rows // max(unpacked, 1))
        batches = parquet.iter_batches(batch_size=rows, columns=needed)
        yield from _sliced(path, batches, chunk_bytes, consumed_before, os.path.getsize(path), metadata.num_rows)
    except (OSError, pa.ArrowException) as error:
        raise InputError(f"{path}: cannot read as Parquet: {error}") from None


def arrow_file_chunks(
    path: str, columns: Sequence[str], chunk_bytes: int, consumed_before: int
) -> Iterator[RecordBatchChunk]:
    """The rows of an Arrow IPC file, in the file ("ARROW1") or the stream format (`save_to_disk`)."""
    try:
        with pa.memory_map(path) as source:
            if source.read(len(ARROW_FILE_MAGIC)) == ARROW_FILE_MAGIC:
                source.seek(0)
                reader = pa.ipc.open_file(source)
                batches = (reader.get_batch(i) for i in range(reader.num_record_batches))
            else:
                source.seek(0)
                reader = pa.ipc.open_stream(source)
                batches = iter(reader)
            needed = _select(path, reader.schema.names, columns)
            # Columns are picked per batch: zero-copy on the memory map.
            selected = (batch.select(needed) for batch in batches)
            yield from _sliced(path, selected, chunk_bytes, consumed_before, os.path.getsize(path), None)
    except (OSError, pa.ArrowException) as error:
        raise InputError(f"{path}: cannot read as Arrow IPC: {error}") from None


def hf_dataset_chunks(name: str, split: str, data_files: Sequence[str], columns: Sequence[str],
                      chunk_bytes: int) -> Iterator[RecordBatchChunk]:
    """The rows of `datasets.load_dataset(name, split=split, data_files=..., streaming=True)`, offline.

    Raises:
        InputError: `name` is neither a local builder nor an existing path, or the dataset fails to load.
    """
    if name not in LOCAL_BUILDERS and not os.path.exists(name):
        raise InputError(f"{name}: --hf-dataset takes a local builder ({', '.join(LOCAL_BUILDERS)}) or a local "
                         "path; tokenmill never downloads from the Hub")
    for variable in _OFFLINE_VARIABLES:  # read when `datasets` is first imported ...
        os.environ[variable] = "1"
    import datasets  # heavy: only for --hf-dataset

    datasets.config.HF_HUB_OFFLINE = datasets.config.HF_DATASETS_OFFLINE = True  # ... or already was

    source = f"{name}[{split}]"
    try:
        stream = datasets.load_dataset(name, split=split, data_files=list(data_files) or None, streaming=True)
        tables = stream.with_format("arrow").iter(batch_size=HF_BATCH_ROWS)
        batches = (batch for table in tables
                   for batch in table.select(_select(source, table.column_names, columns)).to_batches())
        yield from _sliced(source, batches, chunk_bytes, 0, 0, None)
    except (OSError, ValueError, pa.ArrowException, datasets.exceptions.DatasetGenerationError) as error:
        raise InputError(f"{source}: cannot load: {error}") from None
