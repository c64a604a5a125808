"""MindRecord v3.0 (MindSpore's `FileWriter` format), written and read with numpy, numba and sqlite3.

    with MindRecordWriter("out/corpus.mindrecord", np.uint16, num_shards=1) as writer:
        writer.add_documents(tokens, sequence_lengths, document_sequence_counts)
    # MindSpore: mindspore.dataset.MindDataset("out/corpus.mindrecord", columns_list=["input_ids"])
    MindRecordReader("out/corpus.mindrecord")[0]      # indexed_dataset.mindrecord_reader

Files: `name.mindrecord` with `num_shards=1`, else `name.mindrecord0` .. `name.mindrecord{N-1}`, each
with a SQLite index `<file>.db`. Every header stores all shard basenames, so files must not be renamed.
One data file:

    [u64 LE json_len][header JSON][hole up to header_size]
    [page 0 ... hole up to page_size][page 1 ...] ... [last page, ending at its used bytes]

Page k starts at `header_size + k * page_size`. BLOB_DATA pages come first, each holding
consecutive rows as `[u64 LE len][blob]`; a row goes to the current page if it fits, else it opens
the next one (MindSpore's `CutRowGroup`). One RAW_DATA "row group" per blob page then follows in
RAW_DATA pages (`[u64 LE len][msgpack map]` per row, `{"id": 0}` when there are no scalar fields).
The first raw page has `page_type_id` 0, later ones their own `page_id` (MindSpore's quirk).

A blob is the row's one array field, or, with several, `[u64 BE len][field bytes]` per field in
`blob_fields` order. Integer arrays are "CompressInt"-ed (`compress_int`: a count, 2-bit width
codes, then every value little-endian in its narrowed width). The header's `compression_size` is the bytes saved over
all shards. The `.db` holds `SHARD_NAME(NAME)` and one `INDEXES` row per record with page ids and
page-relative offsets. The writer reproduces files of MindSpore 2.10's `FileWriter` byte for byte
(apart from the file names), written as one `write_raw_data` call; unlike it, it keeps empty
documents (MindSpore silently drops them; its readers accept them) unless told to reject them.

Shards and document order: MindSpore cuts each `write_raw_data` call into `num_shards` consecutive
parts (`BreakIntoShards`), so a file written in several calls holds call 1's part, call 2's part, ...
in every shard, and no file records where the calls began: the document order is lost. Our writer
therefore always writes as *one* call of the whole stream, however many `add_documents` calls feed it:
with several shards the framed rows are spooled to a hidden temporary beside the output (extra disk:
about the data's size, until `finalize`) and cut into the shards at the end. Shard 0, 1, ... read in
turn then give the documents in order (to our reader, and to any reader that reads the shards in turn).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sqlite3
import struct

import numpy as np

from .compress_int import compress_int_into, compress_int_sizes
from .errors import TokenmillError
from .names import MINDRECORD_INDEX_SUFFIX, mindrecord_files_name, shard_paths
from .protocol import DocumentBatch, TokenWriter
from .rows import check_document_batch, check_row_layout

logger = logging.getLogger(__name__)

DEFAULT_HEADER_SIZE = 16 * 2**20  # MindSpore's defaults
DEFAULT_PAGE_SIZE = 32 * 2**20
HEADER_SIZE_RANGE = (16 * 2**10, 128 * 2**20)
PAGE_SIZE_RANGE = (32 * 2**10, 256 * 2**20)
SIZE_ALIGNMENT = 4  # MindSpore requires both sizes to be multiples of 4
MAX_SHARDS = 1000
VERSION = "3.0"
SCHEMA_DESC = "tokens"
TOKENS_FIELD = "input_ids"
LENGTHS_FIELD = "sequence_lengths"
EMPTY_DOCUMENT_POLICIES = ("write", "reject")
ENCODE_CHUNK_TOKENS = 2**20
# Spooled rows are copied into the shards in pieces of about this many bytes (bounded memory).
SPOOL_COPY_BYTES = 64 * 2**20
U64_LE = struct.Struct("<Q")
LENGTH_PREFIX_BYTES = 8  # every length prefix (row framing LE, field framing BE) is 8 bytes
# Rows of an all-blob schema get this raw part: [u64 LE 5] + msgpack {"id": 0}.
DUMMY_RAW_ROW = U64_LE.pack(5) + b"\x81\xa2id\x00"
INDEXES_SQL = (
    "CREATE TABLE INDEXES(  ROW_ID               INT  NOT NULL, PAGE_ID_RAW          INT  NOT NULL, "
    "PAGE_OFFSET_RAW      INT  NOT NULL, PAGE_OFFSET_RAW_END  INT  NOT NULL, ROW_GROUP_ID         INT  NOT NULL, "
    "PAGE_ID_BLOB         INT  NOT NULL, PAGE_OFFSET_BLOB     INT  NOT NULL, PAGE_OFFSET_BLOB_END INT  NOT NULL, "
    "PRIMARY KEY(ROW_ID))"
)
SHARD_NAME_SQL = "CREATE TABLE SHARD_NAME(NAME TEXT NOT NULL)"
def concat_int64(arrays: list[np.ndarray]) -> np.ndarray:
    return np.concatenate([np.zeros(0, np.int64), *arrays]).astype(np.int64, copy=False)


def _exclusive_cumsum(values: np.ndarray) -> np.ndarray:
    out = np.zeros(len(values), dtype=np.int64)
    if len(values) > 1:
        np.cumsum(values[:-1], out=out[1:])
    return out


def _put_u64(out: np.ndarray, starts: np.ndarray, values: np.ndarray, byte_order: str) -> None:
    """Write `values[r]` as a u64 (`byte_order` "<" or ">") at `out[starts[r]:starts[r] + 8]`."""
    out[starts[:, None] + np.arange(LENGTH_PREFIX_BYTES)] = values.astype(f"{byte_order}u8").view(np.uint8).reshape(-1, LENGTH_PREFIX_BYTES)


def _check_size(name: str, value: int, bounds: tuple[int, int]) -> None:
    if not bounds[0] <= value <= bounds[1] or value % SIZE_ALIGNMENT:
        raise ValueError(f"{name} must be a multiple of 4 in [{bounds[0]}, {bounds[1]}], got {value}")


class _ShardFile:
    """One data file being written: blob pages go to disk as they fill; raw pages, header and `.db`
    are written by `finish`."""

    def __init__(self, final_path: str, header_size: int, page_size: int) -> None:
        self.final_path = final_path
        directory, name = os.path.split(os.path.abspath(final_path))
        self.temp_path = os.path.join(directory, f".{name}.tmp")
        self.temp_db_path = os.path.join(directory, f".{name}.db.tmp")
        self.header_size, self.page_size = header_size, page_size
        self.file = open(self.temp_path, "wb")
        self.page_used = self.page_raw_bytes = self.page_first_row = self.num_rows = 0
        self.blob_pages: list[tuple[int, int, int]] = []  # (start_row, end_row, used bytes)
        self.row_pages: list[np.ndarray] = []
        self.row_offsets: list[np.ndarray] = []
        self.row_sizes: list[np.ndarray] = []

    def _close_page(self) -> None:
        self.blob_pages.append((self.page_first_row, self.num_rows, self.page_used))
        self.page_used = self.page_raw_bytes = 0
        self.page_first_row = self.num_rows

    def add_rows(self, framed: np.ndarray, frame_sizes: np.ndarray) -> None:
        """Append rows (`framed`: each `[u64 LE len][blob]`, of `frame_sizes` bytes), written straight
        to their place in the current blob page; a row that does not fit opens the next page."""
        frame_ends = np.cumsum(frame_sizes)
        raw_ends = np.arange(1, len(frame_sizes) + 1, dtype=np.int64) * len(DUMMY_RAW_ROW)
        row = 0
        while row < len(frame_sizes):
            done_bytes = int(frame_ends[row - 1]) if row else 0
            done_raw = int(raw_ends[row - 1]) if row else 0
            fit = int(min(
                np.searchsorted(frame_ends, done_bytes + self.page_size - self.page_used, side="right"),
                np.searchsorted(raw_ends, done_raw + self.page_size - self.page_raw_bytes, side="right"),
            ))
            if fit == row:
                if self.num_rows == self.page_first_row:
                    raise TokenmillError(
                        f"{self.final_path}: a {frame_sizes[row]}-byte row does not fit the {self.page_size}-byte page"
                    )
                self._close_page()
                continue
            rows = slice(row, fit)
            self.row_pages.append(np.full(fit - row, len(self.blob_pages), dtype=np.int64))
            self.row_offsets.append(self.page_used + frame_ends[rows] - frame_sizes[rows] - done_bytes)
            self.row_sizes.append(frame_sizes[rows])
            self.file.seek(self.header_size + len(self.blob_pages) * self.page_size + self.page_used)
            self.file.write(memoryview(framed[done_bytes : frame_ends[fit - 1]]))
            self.page_used += int(frame_ends[fit - 1]) - done_bytes
            self.page_raw_bytes += int(raw_ends[fit - 1]) - done_raw
            self.num_rows += fit - row
            row = fit

    def finish(self, header_fields: dict, shard_id: int) -> None:
        """Write the raw pages, the header and the `.db`, all under temporary names.

        Args:
            header_fields: the header keys shared by all shards (`compression_size`, `schema`,
                `shard_addresses`).
            shard_id: this file's shard number.
        """
        if self.page_used:
            self._close_page()
        num_blob = len(self.blob_pages)
        group_rows = np.array([end - start for start, end, _ in self.blob_pages], dtype=np.int64)
        group_raw = group_rows * len(DUMMY_RAW_ROW)
        # One raw row group per blob page, in order; a group never straddles two raw pages (WriteRawPage).
        raw_pages: list[list[tuple[int, int]]] = []  # per raw page: [(group id, offset in page)]
        used = self.page_size + 1
        group_page, group_offset = np.zeros(num_blob, np.int64), np.zeros(num_blob, np.int64)
        for group, size in enumerate(group_raw.tolist()):
            if used + size > self.page_size:
                raw_pages.append([])
                used = 0
            raw_pages[-1].append((group, used))
            group_page[group], group_offset[group] = num_blob + len(raw_pages) - 1, used
            used += size
        pages = [
            _page(shard_id, i, "BLOB_DATA", i, size, [(0, 0)], start, end)
            for i, (start, end, size) in enumerate(self.blob_pages)
        ]
        for j, groups in enumerate(raw_pages):
            page_id = num_blob + j
            rows = int(group_rows[groups[0][0] : groups[-1][0] + 1].sum())
            raw_size = rows * len(DUMMY_RAW_ROW)
            pages.append(_page(shard_id, page_id, "RAW_DATA", page_id if j else 0, raw_size, groups, 0, 0))
            self.file.seek(self.header_size + page_id * self.page_size)
            self.file.write(DUMMY_RAW_ROW * rows)
        header = {"header_size": self.header_size, "index_fields": None, "page": pages, "page_size": self.page_size}
        header.update(header_fields)
        header.update({"shard_id": shard_id, "statistics": None, "version": VERSION})
        encoded = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
        if LENGTH_PREFIX_BYTES + len(encoded) > self.header_size:
            raise TokenmillError(
                f"{self.final_path}: the {len(encoded)}-byte header does not fit header_size {self.header_size}"
            )
        self.file.seek(0)
        self.file.write(U64_LE.pack(len(encoded)) + encoded)
        self.file.close()
        self._write_db(group_rows, group_page, group_offset)

    def _write_db(self, group_rows: np.ndarray, group_page: np.ndarray, group_offset: np.ndarray) -> None:
        blob_page, blob_start = concat_int64(self.row_pages), concat_int64(self.row_offsets)
        blob_end = blob_start + concat_int64(self.row_sizes)
        row_in_group = np.arange(self.num_rows) - np.repeat(_exclusive_cumsum(group_rows), group_rows)
        raw_start = group_offset[blob_page] + row_in_group * len(DUMMY_RAW_ROW)
        columns = (
            np.arange(self.num_rows), group_page[blob_page], raw_start, raw_start + len(DUMMY_RAW_ROW),
            blob_page, blob_page, blob_start, blob_end,
        )
        if os.path.exists(self.temp_db_path):
            os.remove(self.temp_db_path)
        # One transaction and no fsync: like the data file, the .db is only trusted once renamed.
        with sqlite3.connect(self.temp_db_path, isolation_level=None) as db:
            db.execute("PRAGMA synchronous=OFF")
            db.execute("BEGIN")
            db.execute(INDEXES_SQL)
            db.execute(SHARD_NAME_SQL)
            db.execute("INSERT INTO SHARD_NAME (NAME) VALUES (?)", (os.path.basename(self.final_path),))
            db.executemany("INSERT INTO INDEXES VALUES (?, ?, ?, ?, ?, ?, ?, ?)", zip(*(c.tolist() for c in columns)))
            db.execute("COMMIT")
        db.close()

    def publish(self) -> None:
        """Move the `.db` then the data file to their final names."""
        os.replace(self.temp_db_path, self.final_path + MINDRECORD_INDEX_SUFFIX)
        os.replace(self.temp_path, self.final_path)

    def unpublish(self) -> None:
        """Remove the published data file and `.db` (when a later shard of the set failed)."""
        for path in (self.final_path, self.final_path + MINDRECORD_INDEX_SUFFIX):
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)

    def discard(self) -> None:
        with contextlib.suppress(OSError):  # closing flushes, which fails again on a full disk
            self.file.close()
        for path in (self.temp_path, self.temp_db_path):
            if os.path.exists(path):
                os.remove(path)


class _RowSpool:
    """The framed rows of a multi-shard output, in document order, kept in a hidden temporary file
    until the row count (and so each shard's first row) is known."""

    def __init__(self, final_path: str) -> None:
        directory, name = os.path.split(os.path.abspath(final_path))
        self.path = os.path.join(directory, f".{name}.rows.tmp")
        self.file = open(self.path, "wb")
        self.frame_sizes: list[np.ndarray] = []

    def add_rows(self, framed: np.ndarray, frame_sizes: np.ndarray) -> None:
        """Append rows framed as `_ShardFile.add_rows` takes them."""
        self.file.write(memoryview(framed))
        self.frame_sizes.append(np.asarray(frame_sizes, dtype=np.int64))

    def deal(self, shards: list[_ShardFile], ranges: list[tuple[int, int]]) -> None:
        """Give every shard its rows `ranges[i]`, in pieces of about SPOOL_COPY_BYTES."""
        self.file.close()
        sizes = concat_int64(self.frame_sizes)
        ends = np.cumsum(sizes)
        with open(self.path, "rb") as f:
            for shard, (first, last) in zip(shards, ranges):
                while first < last:
                    start = int(ends[first - 1]) if first else 0
                    stop = int(np.searchsorted(ends, start + SPOOL_COPY_BYTES, side="right"))
                    stop = min(max(stop, first + 1), last)
                    f.seek(start)
                    framed = np.frombuffer(f.read(int(ends[stop - 1]) - start), dtype=np.uint8)
                    shard.add_rows(framed, sizes[first:stop])
                    first = stop

    def discard(self) -> None:
        with contextlib.suppress(OSError):  # closing flushes, which fails again on a full disk
            self.file.close()
        with contextlib.suppress(FileNotFoundError):
            os.remove(self.path)


def _page(shard_id: int, page_id: int, kind: str, type_id: int, size: int, groups, start: int, end: int) -> dict:
    """One header page descriptor (keys sorted, as MindSpore's JSON library writes them)."""
    return {
        "end_row_id": end, "page_id": page_id, "page_size": size, "page_type": kind, "page_type_id": type_id,
        "row_group_ids": [{"id": g, "offset": o} for g, o in groups], "shard_id": shard_id, "start_row_id": start,
    }


def _shard_ranges(num_rows: int, num_shards: int) -> list[tuple[int, int]]:
    """Consecutive row ranges `[first, last)` of each shard: MindSpore's `BreakIntoShards` for one call,
    with the `num_rows % num_shards` extra rows given to the first shards (MindSpore: random ones)."""
    shares = np.full(num_shards, num_rows // num_shards)
    shares[: num_rows % num_shards] += 1
    ends = np.cumsum(shares)
    return list(zip((ends - shares).tolist(), ends.tolist()))


class MindRecordWriter(TokenWriter):
    """Streams documents into MindRecord shards, one row per document (`input_ids` int32 or int64).

    Args:
        path: data file name (`x.mindrecord`); with several shards the files are `path0` ...
        dtype: token dtype; ids are range-checked against it. 64-bit dtypes store `int64` arrays.
        num_shards: data files (1..1000). The whole stream of rows is cut into `num_shards`
            consecutive, near-equal parts, as MindSpore's `write_raw_data` cuts one call (the first
            `rows % num_shards` shards hold one row more; MindSpore picks them at random), so the
            shards read in order give the documents in order. With more than one shard the rows are
            spooled to a temporary file first (see the module docstring).
        header_size, page_size: bytes (MindSpore's defaults 16 MiB and 32 MiB).
        empty_documents: "write" (a row with an empty array) or "reject" (raise, with the count).
        store_sequence_lengths: add a `sequence_lengths` array field (several sequences per document).
        published_path: the name the files take once a caller that writes them in a staging folder moves
            them into place, for the log line (default `path`).

    Raises:
        TokenmillError: an output file already exists.
    """

    def __init__(
        self,
        path: str,
        dtype: np.dtype | type,
        *,
        num_shards: int = 1,
        header_size: int = DEFAULT_HEADER_SIZE,
        page_size: int = DEFAULT_PAGE_SIZE,
        empty_documents: str = "write",
        store_sequence_lengths: bool = False,
        published_path: str | None = None,
    ) -> None:
        self.path = str(path)
        self.published_path = str(published_path or path)
        self.dtype = np.dtype(dtype)
        if self.dtype.kind not in "iu" or self.dtype == np.uint64:
            raise ValueError(f"{self.path}: token dtype must be an integer type of at most 63 bits, got {self.dtype}")
        if not 1 <= num_shards <= MAX_SHARDS:
            raise ValueError(f"num_shards must lie in [1, {MAX_SHARDS}], got {num_shards}")
        _check_size("header_size", header_size, HEADER_SIZE_RANGE)
        _check_size("page_size", page_size, PAGE_SIZE_RANGE)
        if empty_documents not in EMPTY_DOCUMENT_POLICIES:
            raise ValueError(f"empty_documents must be one of {EMPTY_DOCUMENT_POLICIES}, got {empty_documents!r}")
        paths = shard_paths(self.path, num_shards)
        existing = [p for p in paths for q in (p, p + MINDRECORD_INDEX_SUFFIX) if os.path.exists(q)]
        if existing:
            raise TokenmillError(f"{existing[0]}: MindRecord output already exists")
        if not os.path.isdir(os.path.dirname(os.path.abspath(self.path))):
            raise TokenmillError(f"{self.path}: output directory does not exist")
        self.empty_documents = empty_documents
        self.store_sequence_lengths = store_sequence_lengths
        self.array_type = "int64" if self.dtype.itemsize == 8 or self.dtype == np.uint32 else "int32"
        self.num_documents = 0
        self.compression_size = 0
        self._shards: list[_ShardFile] = []
        self._spool: _RowSpool | None = None
        try:
            for p in paths:
                self._shards.append(_ShardFile(p, header_size, page_size))
            if num_shards > 1:
                self._spool = _RowSpool(self.path)
        except BaseException:
            self.abort()
            raise

    @property
    def blob_fields(self) -> list[str]:
        return [TOKENS_FIELD, LENGTHS_FIELD] if self.store_sequence_lengths else [TOKENS_FIELD]

    def add_documents(
        self, tokens: np.ndarray, sequence_lengths: np.ndarray, document_sequence_counts: np.ndarray
    ) -> None:
        """Append many documents (the `IndexedDatasetWriter.add_documents` layout), one row each.

        Raises:
            TokenRangeError: an id does not fit the dtype.
            TokenmillError: empty documents under `empty_documents="reject"`, or sequence boundaries
                that need `store_sequence_lengths`.
        """
        self._check_open()
        batch = check_document_batch(
            tokens, sequence_lengths, document_sequence_counts, self.dtype, self.path, self.num_documents
        )
        check_row_layout(batch, self.store_sequence_lengths, self.path, self.num_documents)
        document_offsets = batch.document_token_offsets()
        token_counts = np.diff(document_offsets)
        if self.empty_documents == "reject" and (token_counts == 0).any():
            empty = np.flatnonzero(token_counts == 0)
            raise TokenmillError(
                f"{self.path}: {len(empty)} empty documents in this batch (first: document "
                f"{self.num_documents + int(empty[0])}); MindSpore's FileWriter would drop them silently"
            )
        # One shard is written straight away; several get the rows at the end (see _finish).
        destination = self._spool if self._spool is not None else self._shards[0]
        first, last = 0, batch.num_documents
        # Encode in pieces of about ENCODE_CHUNK_TOKENS: the temporaries stay in cache.
        while first < last:
            chunk_end = document_offsets[first] + ENCODE_CHUNK_TOKENS
            stop = min(max(int(np.searchsorted(document_offsets, chunk_end, "right")) - 1, first + 1), last)
            destination.add_rows(*self._encode(batch.documents(first, stop)))
            first = stop
        self.num_documents += batch.num_documents

    def _encode(self, batch: DocumentBatch) -> tuple[np.ndarray, np.ndarray]:
        """Every row framed for a blob page, `[u64 LE blob len][blob]`; adds up the compression saving.

        Returns:
            (uint8 [B] the framed rows back to back, int64 [R] bytes per framed row).
        """
        token_counts = np.diff(batch.document_token_offsets())
        itemsize = 8 if self.array_type == "int64" else 4
        id_sizes = compress_int_sizes(batch.tokens, token_counts)
        if self.store_sequence_lengths:
            length_sizes = compress_int_sizes(batch.sequence_lengths, batch.document_sequence_counts)
            blob_sizes = 2 * LENGTH_PREFIX_BYTES + id_sizes + length_sizes
            plain = 2 * LENGTH_PREFIX_BYTES * batch.num_documents + itemsize * len(batch.tokens) + 4 * len(batch.sequence_lengths)
        else:
            blob_sizes = id_sizes
            plain = itemsize * len(batch.tokens)
        self.compression_size += plain - int(blob_sizes.sum())
        frame_sizes = LENGTH_PREFIX_BYTES + blob_sizes
        frame_starts = _exclusive_cumsum(frame_sizes)
        framed = np.empty(int(frame_sizes.sum()), dtype=np.uint8)
        _put_u64(framed, frame_starts, blob_sizes, "<")
        if not self.store_sequence_lengths:
            compress_int_into(batch.tokens, token_counts, framed, frame_starts + LENGTH_PREFIX_BYTES, id_sizes)
            return framed, frame_sizes
        # Several blob fields: each is [u64 BE field len][field bytes], in blob_fields order.
        _put_u64(framed, frame_starts + LENGTH_PREFIX_BYTES, id_sizes, ">")
        compress_int_into(batch.tokens, token_counts, framed, frame_starts + 2 * LENGTH_PREFIX_BYTES, id_sizes)
        length_starts = frame_starts + 2 * LENGTH_PREFIX_BYTES + id_sizes
        _put_u64(framed, length_starts, length_sizes, ">")
        lengths, counts = batch.sequence_lengths, batch.document_sequence_counts
        compress_int_into(lengths, counts, framed, length_starts + LENGTH_PREFIX_BYTES, length_sizes)
        return framed, frame_sizes

    def _finish(self) -> None:
        """Write every shard's raw pages, header and `.db`, then move them into place."""
        schema = {TOKENS_FIELD: {"shape": [-1], "type": self.array_type}}
        if self.store_sequence_lengths:
            schema[LENGTHS_FIELD] = {"shape": [-1], "type": "int32"}
        shared = {
            "compression_size": max(self.compression_size, 0),
            "schema": [{"blob_fields": self.blob_fields, "desc": SCHEMA_DESC, "schema": schema}],
            "shard_addresses": [os.path.basename(s.final_path) for s in self._shards],
        }
        if self._spool is not None:
            self._spool.deal(self._shards, _shard_ranges(self.num_documents, len(self._shards)))
        for shard_id, shard in enumerate(self._shards):
            shard.finish(shared, shard_id)
        published = []
        try:
            for shard in self._shards:
                shard.publish()
                published.append(shard)
        except BaseException:  # also an interruption: never leave some shards of a set
            for shard in published:
                shard.unpublish()
            raise
        if self._spool is not None:
            self._spool.discard()
        logger.info(
            "%s: %d documents in %d MindRecord shard(s), compression saved %d bytes",
            mindrecord_files_name(self.published_path, len(self._shards)), self.num_documents, len(self._shards),
            self.compression_size,
        )

    def _discard(self) -> None:
        for shard in self._shards:
            shard.discard()
        if self._spool is not None:
            self._spool.discard()
