"""MindRecord v3.0 (MindSpore's `FileWriter` format), written and read with numpy and sqlite3 alone.

    with MindRecordWriter("out/corpus.mindrecord", np.uint16, num_shards=1) as writer:
        writer.add_documents(tokens, sequence_lengths, document_sequence_counts)
    # MindSpore: mindspore.dataset.MindDataset("out/corpus.mindrecord", columns_list=["input_ids"])
    MindRecordReader("out/corpus.mindrecord")[0]

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
`blob_fields` order. Integer arrays are "CompressInt"-ed: `u32 BE` element count, a bitmap of 2-bit
width codes (0 int8, 1 int16, 2 int32, 3 int64; most significant bits first, 4 per byte), then every
value little-endian in its narrowed width. The header's `compression_size` is the bytes saved over
all shards. The `.db` holds `SHARD_NAME(NAME)` and one `INDEXES` row per record with page ids and
page-relative offsets. The writer reproduces files of MindSpore 2.10's `FileWriter` byte for byte
(apart from the file names), written as one `write_raw_data` call; unlike it, it keeps empty
documents (MindSpore silently drops them; its readers accept them) unless told to reject them.
"""

from __future__ import annotations

import json
import logging
import mmap
import os
import sqlite3
import struct
from collections.abc import Sequence

import numpy as np

from .errors import TokenmillError
from .formats import (
    DocumentBatch,
    RowDocumentsReader,
    RowShardWriter,
    ShardFormatError,
    check_document_batch,
    check_row_layout,
    row_structure,
)

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
_U64 = struct.Struct("<Q")
_LEN = 8  # every length prefix (row framing LE, field framing BE) is 8 bytes
_COUNT = 4  # CompressInt's u32 BE element count
_CODES_PER_BYTE = 4
# Rows of an all-blob schema get this raw part: [u64 LE 5] + msgpack {"id": 0}.
DUMMY_RAW_ROW = _U64.pack(5) + b"\x81\xa2id\x00"
INDEXES_SQL = (
    "CREATE TABLE INDEXES(  ROW_ID               INT  NOT NULL, PAGE_ID_RAW          INT  NOT NULL, "
    "PAGE_OFFSET_RAW      INT  NOT NULL, PAGE_OFFSET_RAW_END  INT  NOT NULL, ROW_GROUP_ID         INT  NOT NULL, "
    "PAGE_ID_BLOB         INT  NOT NULL, PAGE_OFFSET_BLOB     INT  NOT NULL, PAGE_OFFSET_BLOB_END INT  NOT NULL, "
    "PRIMARY KEY(ROW_ID))"
)
SHARD_NAME_SQL = "CREATE TABLE SHARD_NAME(NAME TEXT NOT NULL)"
_INT_WIDTH_BOUNDS = [np.iinfo(t) for t in (np.int8, np.int16, np.int32)]
_NARROW_DTYPES = ("<i1", "<i2", "<i4", "<i8")
_EXTRA_BYTES = np.array([0, 1, 3, 7], dtype=np.uint8)  # width - 1 for each code
_UINT16_MAX = np.iinfo(np.uint16).max
# Largest id each code holds as a non-negative value once widened to two bytes (int8, int16, then 2 bytes).
_SIGNED_LIMITS = np.array([np.iinfo(np.int8).max, np.iinfo(np.int16).max, _UINT16_MAX], dtype=np.uint16)


def _concat_int64(arrays: list[np.ndarray]) -> np.ndarray:
    return np.concatenate([np.zeros(0, np.int64), *arrays]).astype(np.int64, copy=False)


def _exclusive_cumsum(values: np.ndarray) -> np.ndarray:
    out = np.zeros(len(values), dtype=np.int64)
    if len(values) > 1:
        np.cumsum(values[:-1], out=out[1:])
    return out


def _segment_labels(sizes: np.ndarray) -> np.ndarray:
    """uint8 [sum of sizes]: for sizes [R, K] of K segments per row, the segment number of every byte."""
    return np.repeat(np.tile(np.arange(sizes.shape[1], dtype=np.uint8), sizes.shape[0]), sizes.ravel())


def interleave_rows(segments: Sequence[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """Row r of the output is segment 0's row r, then segment 1's row r, ...

    The segments before the last are interleaved first (recursively), then merged with the last one
    through one boolean mask: two masked copies over the output, no per-byte index arrays. Put the
    largest segment last; this is the writer's hot path.

    Args:
        segments: (flat uint8 bytes, int64 [R] bytes per row) for each segment.

    Returns:
        (uint8 [sum of all sizes], int64 [R] bytes per output row).
    """
    last, last_sizes = segments[-1]
    last_sizes = np.asarray(last_sizes, dtype=np.int64)
    if len(segments) == 1:
        return last, last_sizes
    head, head_sizes = interleave_rows(segments[:-1])
    is_last = np.repeat(np.tile([False, True], len(last_sizes)), np.stack([head_sizes, last_sizes], axis=1).ravel())
    out = np.empty(len(is_last), dtype=np.uint8)
    out[is_last] = last
    out[~is_last] = head
    return out, head_sizes + last_sizes


def _width_codes(values: np.ndarray) -> np.ndarray:
    """uint8 [N]: CompressInt's width code of every value (0 int8, 1 int16, 2 int32, 3 int64)."""
    codes = np.zeros(len(values), dtype=np.uint8)
    if not len(values):
        return codes
    low, high = values.min(), values.max()
    for bounds in _INT_WIDTH_BOUNDS:  # one more width step for each range a value leaves
        if bounds.min <= low and high <= bounds.max:
            break
        codes += values > bounds.max if low >= 0 else (values < bounds.min) | (values > bounds.max)
    return codes


def _byte_masks(codes: np.ndarray, stride: int) -> np.ndarray:
    """bool [N * stride]: for each value laid out in `stride` bytes, which bytes its width keeps.

    One table lookup per value of a `stride`-byte word whose bytes are 0/1 (a broadcast comparison
    is several times slower).
    """
    table = np.array([[int(b < (1 << c)) for b in range(stride)] for c in range(len(_NARROW_DTYPES))], np.uint8)
    return table.view(f"<u{stride}").ravel()[codes].view(np.bool_)


def _pack_bitmap(codes: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(uint8 bitmap bytes of all rows, int64 bitmap bytes per row): 4 codes a byte, first code highest."""
    bitmap_sizes = (counts + _CODES_PER_BYTE - 1) // _CODES_PER_BYTE
    pads = bitmap_sizes * _CODES_PER_BYTE - counts  # each row's last byte is filled up with code 0
    quads = np.insert(codes, np.repeat(np.cumsum(counts), pads), 0).reshape(-1, _CODES_PER_BYTE)
    return (quads[:, 0] << 6) | (quads[:, 1] << 4) | (quads[:, 2] << 2) | quads[:, 3], bitmap_sizes


def _pack_values(values: np.ndarray, codes: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every value little-endian in its code's width: (uint8 bytes concatenated, int64 [R] bytes per row)."""
    if len(values) and codes.max() <= 2 and values.min() >= 0 and values.max() <= _UINT16_MAX:
        # Token ids below 65536 (the common case): keep each id's two bytes, drop the high byte of the
        # int8 ones, then insert the two zero bytes the int32 ones need. Compacting 2 bytes per id
        # instead of a 4-byte word is what keeps this near memory speed.
        two_bytes = np.ascontiguousarray(values, dtype="<u2").view(np.uint8)
        keep = np.ones(len(two_bytes), dtype=bool)
        keep[1::2] = codes != 0
        packed = np.compress(keep, two_bytes)
        narrow, wide = np.flatnonzero(codes == 0), np.flatnonzero(codes == 2)
        if wide.size:
            packed = np.insert(packed, np.repeat(2 * (wide + 1) - np.searchsorted(narrow, wide), 2), 0)
        # Value j starts at byte 2j - (int8 values before it) + 2 (int32 values before it).
        bounds = np.concatenate([[0], np.cumsum(counts)])
        starts = 2 * bounds - np.searchsorted(narrow, bounds) + 2 * np.searchsorted(wide, bounds)
        return packed, np.diff(starts)
    stride = 1 << int(codes.max()) if len(codes) else 1
    narrow_bytes = values.astype(_NARROW_DTYPES[stride.bit_length() - 1]).view(np.uint8)
    return np.compress(_byte_masks(codes, stride), narrow_bytes), counts + _row_sums(_EXTRA_BYTES[codes], counts)


def _row_sums(per_value: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """int64 [R]: `per_value` summed over each row (rows of `counts` values, 0 allowed)."""
    sums = np.zeros(len(counts), dtype=np.int64)
    filled = counts > 0
    if filled.any():
        sums[filled] = np.add.reduceat(per_value, (np.cumsum(counts) - counts)[filled], dtype=np.int64)
    return sums


def compress_int_parts(values: np.ndarray, counts: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    """The three CompressInt parts of every row, as `interleave_rows` segments.

    Args:
        values: [N] integers, the rows concatenated.
        counts: int64 [R] elements per row.

    Returns:
        [(u32 BE counts, 4 per row), (bitmaps, (n + 3) // 4 per row), (narrowed values, per row)].
    """
    values = np.asarray(values)
    codes = _width_codes(values)
    bitmap, bitmap_sizes = _pack_bitmap(codes, counts)
    return [
        (counts.astype(">u4").view(np.uint8), np.full(len(counts), _COUNT)),
        (bitmap, bitmap_sizes),
        _pack_values(values, codes, counts),
    ]


def compress_int_rows(values: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """CompressInt every row: (uint8 [B] the encoded rows concatenated, int64 [R] bytes per row)."""
    return interleave_rows(compress_int_parts(values, np.asarray(counts, dtype=np.int64)))


# Bitmap byte -> its 4 codes (first code in byte 0), looked up as one uint32 per byte.
_BITMAP_CODES = np.array([[(b >> s) & 3 for s in (6, 4, 2, 0)] for b in range(256)], np.uint8).view("<u4").ravel()


def decompress_int_rows(data: np.ndarray, starts: np.ndarray, sizes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Decode CompressInt arrays stored at `[starts, starts + sizes)` of `data`, in increasing order.

    Args:
        data: uint8 buffer (e.g. a whole memory-mapped shard).
        starts: int64 [R] offset of each encoded array; sizes: int64 [R] its bytes.

    Returns:
        (values concatenated: uint16 [N] when all are ids below 65536, else int64 [N];
        int64 [R] elements per row).

    Raises:
        ShardFormatError: an array's count, bitmap and size disagree.
    """
    starts, sizes = np.asarray(starts, dtype=np.int64), np.asarray(sizes, dtype=np.int64)
    if not len(starts):
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    count_bytes = data[starts[:, None] + np.arange(_COUNT)].astype(np.int64)
    counts = (count_bytes[:, 0] << 24) | (count_bytes[:, 1] << 16) | (count_bytes[:, 2] << 8) | count_bytes[:, 3]
    bitmap_sizes = (counts + _CODES_PER_BYTE - 1) // _CODES_PER_BYTE
    value_sizes = sizes - _COUNT - bitmap_sizes
    bad = np.flatnonzero((value_sizes < counts) | (value_sizes > 8 * counts))
    if bad.size:
        raise ShardFormatError(f"row {bad[0]}: CompressInt count {counts[bad[0]]} does not fit {sizes[bad[0]]} bytes")
    first, last = int(starts[0]), int(starts[-1] + sizes[-1])
    gaps = starts - np.concatenate([[first], (starts + sizes)[:-1]])
    labels = _segment_labels(np.stack([gaps + _COUNT, bitmap_sizes, value_sizes], axis=1))
    region = data[first:last]
    bitmaps, packed = np.compress(labels == 1, region), np.compress(labels == 2, region)
    padded = _BITMAP_CODES[bitmaps].view(np.uint8)
    pads = bitmap_sizes * _CODES_PER_BYTE - counts
    codes = padded[_segment_labels(np.stack([counts, pads], axis=1)) == 0]
    return _unpack_values(packed, codes), counts


def _unpack_values(packed: np.ndarray, codes: np.ndarray) -> np.ndarray:
    """Values from their narrowed bytes: uint16 [N] when all are ids in [0, 65535], else int64 [N].

    Raises:
        ShardFormatError: the widths do not add up to the bytes.
    """
    if len(codes) and codes.max() <= 2:
        # The writer's fast path backwards: drop the zero high bytes of int32 values, widen int8 values
        # to two bytes, and keep the result if every value is a non-negative id below 65536.
        wide, narrow = np.flatnonzero(codes == 2), np.flatnonzero(codes == 0)
        high = 2 * (wide + 1) - np.searchsorted(narrow, wide) + 2 * np.arange(len(wide))
        zero_bytes = np.stack([high, high + 1], axis=1).ravel()
        if 2 * len(codes) - len(narrow) + 2 * len(wide) == len(packed) and not packed[zero_bytes].any():
            two = np.delete(packed, zero_bytes)
            words = np.insert(two, 2 * narrow - np.arange(len(narrow)) + 1, 0).view("<u2")
            if not (words > _SIGNED_LIMITS[codes]).any():
                return words
    stride = 1 << int(codes.max()) if len(codes) else 1
    keep = _byte_masks(codes, stride)
    if int(keep.sum()) != len(packed):
        raise ShardFormatError("CompressInt widths do not add up to the stored value bytes")
    words = np.zeros(len(codes) * stride, dtype=np.uint8)
    words[keep] = packed
    values = words.view(f"<u{stride}").astype(np.int64)
    # Narrow values were stored zero-extended in their word: sign-extend each from its own width.
    sign = np.array([1 << (8 * (1 << c) - 1) if c < 3 else 0 for c in range(4)], dtype=np.int64)[codes]
    return (values ^ sign) - sign


def _le_u64(values: np.ndarray) -> np.ndarray:
    return values.astype("<u8").view(np.uint8)


def _be_u64(values: np.ndarray) -> np.ndarray:
    return values.astype(">u8").view(np.uint8)


def _byte_columns(rows: int, *parts: np.ndarray) -> np.ndarray:
    """Fixed-size per-row byte fields side by side: uint8 [rows * total width] (each part [rows * width])."""
    return np.concatenate([p.reshape(rows, -1) for p in parts], axis=1).ravel()


def shard_paths(path: str, num_shards: int) -> list[str]:
    """Data file names: `path` itself for one shard, else `path0` .. `path{N-1}`."""
    return [str(path)] if num_shards == 1 else [f"{path}{i}" for i in range(num_shards)]


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
        if _LEN + len(encoded) > self.header_size:
            raise TokenmillError(
                f"{self.final_path}: the {len(encoded)}-byte header does not fit header_size {self.header_size}"
            )
        self.file.seek(0)
        self.file.write(_U64.pack(len(encoded)) + encoded)
        self.file.close()
        self._write_db(group_rows, group_page, group_offset)

    def _write_db(self, group_rows: np.ndarray, group_page: np.ndarray, group_offset: np.ndarray) -> None:
        blob_page, blob_start = _concat_int64(self.row_pages), _concat_int64(self.row_offsets)
        blob_end = blob_start + _concat_int64(self.row_sizes)
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
        os.replace(self.temp_db_path, self.final_path + ".db")
        os.replace(self.temp_path, self.final_path)

    def discard(self) -> None:
        self.file.close()
        for path in (self.temp_path, self.temp_db_path):
            if os.path.exists(path):
                os.remove(path)


def _page(shard_id: int, page_id: int, kind: str, type_id: int, size: int, groups, start: int, end: int) -> dict:
    """One header page descriptor (keys sorted, as MindSpore's JSON library writes them)."""
    return {
        "end_row_id": end, "page_id": page_id, "page_size": size, "page_type": kind, "page_type_id": type_id,
        "row_group_ids": [{"id": g, "offset": o} for g, o in groups], "shard_id": shard_id, "start_row_id": start,
    }


class MindRecordWriter(RowShardWriter):
    """Streams documents into MindRecord shards, one row per document (`input_ids` int32 or int64).

    Args:
        path: data file name (`x.mindrecord`); with several shards the files are `path0` ...
        dtype: token dtype; ids are range-checked against it. 64-bit dtypes store `int64` arrays.
        num_shards: data files (1..1000). As MindSpore's `write_raw_data` does, each `add_documents`
            call is cut into `num_shards` consecutive, near-equal parts (extra rows go to the shards
            holding fewest); readers go through the shards in order.
        header_size, page_size: bytes (MindSpore's defaults 16 MiB and 32 MiB).
        empty_documents: "write" (a row with an empty array) or "reject" (raise, with the count).
        store_sequence_lengths: add a `sequence_lengths` array field (several sequences per document).

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
    ) -> None:
        self.path = str(path)
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
        existing = [p for p in paths for q in (p, p + ".db") if os.path.exists(q)]
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
        try:
            for p in paths:
                self._shards.append(_ShardFile(p, header_size, page_size))
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
        for shard, (first, last) in zip(self._shards, self._split(batch.num_documents)):
            # Encode in pieces of about ENCODE_CHUNK_TOKENS: the temporaries stay in cache.
            while first < last:
                chunk_end = document_offsets[first] + ENCODE_CHUNK_TOKENS
                stop = min(max(int(np.searchsorted(document_offsets, chunk_end, "right")) - 1, first + 1), last)
                shard.add_rows(*self._encode(batch.documents(first, stop)))
                first = stop
        self.num_documents += batch.num_documents

    def _encode(self, batch: DocumentBatch) -> tuple[np.ndarray, np.ndarray]:
        """Every row framed for a blob page, `[u64 LE blob len][blob]`; adds up the compression saving."""
        rows = batch.num_documents
        token_counts = np.diff(batch.document_token_offsets())
        itemsize = 8 if self.array_type == "int64" else 4
        count_part, *id_parts = compress_int_parts(batch.tokens, token_counts)
        id_sizes = _COUNT + id_parts[0][1] + id_parts[1][1]
        if self.store_sequence_lengths:
            length_count, *length_parts = compress_int_parts(batch.sequence_lengths, batch.document_sequence_counts)
            length_sizes = _COUNT + length_parts[0][1] + length_parts[1][1]
            blob_sizes = 2 * _LEN + id_sizes + length_sizes
            plain = 2 * _LEN * rows + itemsize * len(batch.tokens) + 4 * len(batch.sequence_lengths)
            head = _byte_columns(rows, _le_u64(blob_sizes), _be_u64(id_sizes), count_part[0])
            middle = _byte_columns(rows, _be_u64(length_sizes), length_count[0])
            segments = [(head, 2 * _LEN + _COUNT), *id_parts, (middle, _LEN + _COUNT), *length_parts]
        else:
            blob_sizes = id_sizes
            plain = itemsize * len(batch.tokens)
            segments = [(_byte_columns(rows, _le_u64(blob_sizes), count_part[0]), _LEN + _COUNT), *id_parts]
        self.compression_size += plain - int(blob_sizes.sum())
        return interleave_rows([(flat, np.broadcast_to(sizes, (rows,))) for flat, sizes in segments])

    def _split(self, num_rows: int) -> list[tuple[int, int]]:
        """Consecutive row ranges of this batch for each shard."""
        shares = np.full(len(self._shards), num_rows // len(self._shards))
        held = np.array([s.num_rows for s in self._shards])
        shares[np.argsort(held, kind="stable")[: num_rows % len(self._shards)]] += 1
        ends = np.cumsum(shares)
        return list(zip((ends - shares).tolist(), ends.tolist()))

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
        for shard_id, shard in enumerate(self._shards):
            shard.finish(shared, shard_id)
        for shard in self._shards:
            shard.publish()
        logger.info(
            "%s: %d documents in %d MindRecord shard(s), compression saved %d bytes",
            self.path, self.num_documents, len(self._shards), self.compression_size,
        )

    def _discard(self) -> None:
        for shard in self._shards:
            shard.discard()


def read_header(path: str) -> dict:
    """The JSON header of one MindRecord data file.

    Raises:
        ShardFormatError: the file is missing or its header is not MindRecord's.
    """
    try:
        with open(path, "rb") as f:
            prefix = f.read(_LEN)
            if len(prefix) < _LEN:
                raise ShardFormatError(f"{path}: truncated before the header length at offset 0")
            (length,) = _U64.unpack(prefix)
            if length > os.fstat(f.fileno()).st_size - _LEN:
                raise ShardFormatError(f"{path}: header length {length} at offset 0 runs past the end of the file")
            text = f.read(length)
        header = json.loads(text)
    except OSError as error:
        raise ShardFormatError(f"{path}: cannot read ({error.strerror})") from None
    except ValueError:
        raise ShardFormatError(f"{path}: no MindRecord JSON header at offset 8") from None
    required = ("header_size", "page_size", "schema", "shard_addresses", "version")
    if not isinstance(header, dict) or any(key not in header for key in required):
        raise ShardFormatError(f"{path}: the header lacks one of {', '.join(required)}")
    if header["version"] not in ("2.0", VERSION):
        raise ShardFormatError(f"{path}: unsupported MindRecord version {header['version']!r}")
    return header


class _ShardView:
    """One data file being read: its memory map and the blob offset of every row."""

    def __init__(self, path: str, header: dict, field_index: int, num_fields: int) -> None:
        self.path = path
        db_path = path + ".db"
        if not os.path.isfile(db_path):
            raise ShardFormatError(f"{db_path}: no such file (every MindRecord data file needs its .db)")
        try:
            with sqlite3.connect(f"file:{db_path}?mode=ro", uri=True) as db:
                rows = db.execute(
                    "SELECT PAGE_ID_BLOB, PAGE_OFFSET_BLOB, PAGE_OFFSET_BLOB_END FROM INDEXES ORDER BY ROW_ID"
                ).fetchall()
            db.close()
        except sqlite3.Error as error:
            raise ShardFormatError(f"{db_path}: not a MindRecord index ({error})") from None
        index = np.array(rows, dtype=np.int64).reshape(-1, 3)
        page_starts = header["header_size"] + index[:, 0] * header["page_size"]
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else b""
        self.data = np.frombuffer(self._map, dtype=np.uint8)
        if len(index) and int((page_starts + index[:, 2]).max()) > size:
            raise ShardFormatError(f"{path}: the .db points past the end of the {size}-byte file")
        blob_starts = page_starts + index[:, 1] + _LEN
        blob_sizes = index[:, 2] - index[:, 1] - _LEN
        # (start, size) of every blob field: the whole blob, or a walk over [u64 BE len][bytes] pieces
        self.fields = []
        position = blob_starts
        for _ in range(num_fields if num_fields > 1 else 0):
            sizes = self._big_endian(position, _LEN)
            self.fields.append((position + _LEN, sizes))
            position = position + _LEN + sizes
        if num_fields == 1:
            self.fields.append((blob_starts, blob_sizes))
        elif len(index) and (position != blob_starts + blob_sizes).any():
            raise ShardFormatError(f"{path}: blob field lengths do not add up to the blob sizes in the .db")
        self.token_field = field_index
        self.token_counts = self._big_endian(self.fields[field_index][0], _COUNT)

    def _big_endian(self, starts: np.ndarray, width: int) -> np.ndarray:
        raw = self.data[starts[:, None] + np.arange(width)].astype(np.int64)
        return (raw << (8 * np.arange(width - 1, -1, -1))).sum(axis=1)

    def decode(self, first: int, last: int, field: int) -> tuple[np.ndarray, np.ndarray]:
        """Rows `[first, last)` of blob field number `field`: (int64 values, int64 counts per row)."""
        starts, sizes = self.fields[field]
        try:
            return decompress_int_rows(self.data, starts[first:last], sizes[first:last])
        except ShardFormatError as error:
            raise ShardFormatError(f"{self.path}: {error}") from None


class MindRecordReader(RowDocumentsReader):
    """Reads a MindRecord token dataset (ours or MindSpore's): every shard, in shard order.

    Args:
        path: any one data file (`x.mindrecord` or `x.mindrecord3`); its siblings come from the header.

    Raises:
        ShardFormatError: a file is missing or damaged, or there is no integer-array `input_ids` field.
    """

    def __init__(self, path: str) -> None:
        self.path = str(path)
        first_header = read_header(self.path)
        directory = os.path.dirname(os.path.abspath(self.path))
        try:
            schema = first_header["schema"][0]
            blob_fields = list(schema["blob_fields"])
            field_type = schema["schema"][TOKENS_FIELD]["type"]
        except (LookupError, TypeError):
            blob_fields, field_type = [], None
        if TOKENS_FIELD not in blob_fields or field_type not in ("int32", "int64"):
            raise ShardFormatError(f"{self.path}: no int32/int64 array field {TOKENS_FIELD!r} in the schema")
        self.dtype = np.dtype(field_type)
        self.paths = [os.path.join(directory, name) for name in first_header["shard_addresses"]]
        self._shards = []
        for shard_path in self.paths:
            header = read_header(shard_path) if shard_path != os.path.abspath(self.path) else first_header
            self._shards.append(_ShardView(shard_path, header, blob_fields.index(TOKENS_FIELD), len(blob_fields)))
        self._row_starts = np.concatenate([[0], np.cumsum([len(s.token_counts) for s in self._shards])])
        row_tokens = _concat_int64([s.token_counts for s in self._shards])
        if LENGTHS_FIELD in blob_fields:
            lengths_field = blob_fields.index(LENGTHS_FIELD)
            decoded = [s.decode(0, len(s.token_counts), lengths_field) for s in self._shards]
            lengths = _concat_int64([d[0] for d in decoded])
            counts = _concat_int64([d[1] for d in decoded])
            self.sequence_lengths, self.document_indices = row_structure(row_tokens, lengths, counts)
        else:
            self.sequence_lengths, self.document_indices = row_structure(row_tokens, None, None)
        self._build_offsets()
        if self.num_tokens != int(row_tokens.sum()):
            raise ShardFormatError(f"{self.path}: the {LENGTHS_FIELD} field does not add up to the tokens")

    def read_rows(self, first: int, last: int) -> np.ndarray:
        parts = [np.zeros(0, self.dtype)]
        for shard, start in zip(self._shards, self._row_starts[:-1].tolist()):
            lo, hi = max(first - start, 0), min(last - start, len(shard.token_counts))
            ends = np.cumsum(shard.token_counts[lo:hi])
            while lo < hi:  # decode about ENCODE_CHUNK_TOKENS at a time: the temporaries stay in cache
                stop = min(max(int(np.searchsorted(ends, ENCODE_CHUNK_TOKENS, "right")), 1), hi - lo)
                parts.append(shard.decode(lo, lo + stop, shard.token_field)[0].astype(self.dtype))
                lo, ends = lo + stop, ends[stop:] - ends[stop - 1]
        return np.concatenate(parts)
