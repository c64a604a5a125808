"""Reading MindRecord v3.0 files (any writer's: MindSpore's or ours) with numpy, numba and sqlite3.

    reader = MindRecordReader("out/corpus.mindrecord")     # any shard; its siblings are found from the header
    reader[0], reader.document(3), reader.sequence_lengths

The layout is described once, in `indexed_dataset/mindrecord.py`. Rows are located through each shard's
`.db` index and decoded in one numba call per shard (`compress_int`).
"""

from __future__ import annotations

import json
import mmap
import os
import sqlite3

import numpy as np

from .compress_int import COUNT_BYTES, decompress_int_rows
from .errors import ShardFormatError
from .mindrecord import (
    HEADER_SIZE_RANGE,
    LENGTH_PREFIX_BYTES,
    LENGTHS_FIELD,
    PAGE_SIZE_RANGE,
    TOKENS_FIELD,
    U64_LE,
    VERSION,
    concat_int64,
)
from .names import MINDRECORD_INDEX_SUFFIX, first_data_file
from .path_rules import file_inside
from .rows import RowDocumentsReader, row_structure


def read_header(path: str) -> dict:
    """The JSON header of one MindRecord data file, with the types of the keys we use checked.

    Raises:
        ShardFormatError: the file is missing, its header is not MindRecord's, or a key we use has the
            wrong type (`page_size` null or a string, `shard_addresses` empty or not names, ...).
    """
    try:
        with open(path, "rb") as f:
            prefix = f.read(LENGTH_PREFIX_BYTES)
            if len(prefix) < LENGTH_PREFIX_BYTES:
                raise ShardFormatError(f"{path}: truncated before the header length at offset 0")
            (length,) = U64_LE.unpack(prefix)
            if length > os.fstat(f.fileno()).st_size - LENGTH_PREFIX_BYTES:
                raise ShardFormatError(f"{path}: header length {length} at offset 0 runs past the end of the file")
            text = f.read(length)
        header = json.loads(text)
    except OSError as error:
        raise ShardFormatError(f"{path}: cannot read ({error.strerror})") from None
    except (ValueError, RecursionError):
        raise ShardFormatError(f"{path}: no MindRecord JSON header at offset 8") from None
    required = ("header_size", "page_size", "schema", "shard_addresses", "version", "page")
    if not isinstance(header, dict) or any(key not in header for key in required):
        raise ShardFormatError(f"{path}: the header lacks one of {', '.join(required)}")
    if header["version"] not in ("2.0", VERSION):
        raise ShardFormatError(f"{path}: unsupported MindRecord version {header['version']!r}")
    for key, (low, high) in (("header_size", HEADER_SIZE_RANGE), ("page_size", PAGE_SIZE_RANGE)):
        if not _is_int(header[key]) or not low <= header[key] <= high:
            raise ShardFormatError(f"{path}: header {key} is {header[key]!r}, not an integer in [{low}, {high}]")
    if LENGTH_PREFIX_BYTES + length > header["header_size"]:
        raise ShardFormatError(f"{path}: the {length}-byte header JSON does not fit header_size {header['header_size']}")
    addresses = header["shard_addresses"]
    if (not isinstance(addresses, list) or not addresses
            or not all(isinstance(a, str) and a and os.path.basename(a) == a for a in addresses)):
        raise ShardFormatError(f"{path}: header shard_addresses is {addresses!r}, not a non-empty list of file names")
    if not isinstance(header["page"], list) or not all(isinstance(page, dict) for page in header["page"]):
        raise ShardFormatError(f"{path}: header page is not a list of page descriptors")
    return header


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _blob_pages(path: str, header: dict) -> np.ndarray:
    """The BLOB_DATA pages of a header, checked: int64 [P, 4] rows of (page_id, start_row, end_row,
    used bytes), in row order, their row ranges back to back from row 0.

    Raises:
        ShardFormatError: a descriptor lacks a key or holds a non-integer, or the pages do not tile
            the rows, or the file does not end where its last page does.
    """
    keys = ("page_id", "start_row_id", "end_row_id", "page_size")
    pages, file_end = [], header["header_size"]
    for number, page in enumerate(header["page"]):
        values = [page.get(key) for key in keys]
        if not all(_is_int(v) and v >= 0 for v in values) or values[3] > header["page_size"]:
            raise ShardFormatError(f"{path}: header page {number} has a missing or invalid {', '.join(keys)}")
        file_end = max(file_end, header["header_size"] + values[0] * header["page_size"] + values[3])
        if page.get("page_type") == "BLOB_DATA":
            pages.append(values)
    table = np.array(pages, dtype=np.int64).reshape(-1, 4)
    table = table[np.argsort(table[:, 1], kind="stable")]
    expected_starts = np.concatenate([[0], table[:-1, 2]]) if len(table) else table[:, 1]
    if (table[:, 1] != expected_starts).any() or (table[:, 2] < table[:, 1]).any():
        raise ShardFormatError(f"{path}: the header's blob pages do not cover rows 0..N back to back")
    size = os.path.getsize(path)
    if not header["page"] and size <= file_end:
        return table  # a shard that got no rows is its header alone (MindSpore writes no padding after it)
    if size != file_end:
        raise ShardFormatError(f"{path}: {size} bytes, but its header's pages end at byte {file_end}"
                               + (" (truncated)" if size < file_end else ""))
    return table


def _read_index(data_path: str) -> np.ndarray:
    """int64 [R, 4]: (ROW_ID, PAGE_ID_BLOB, PAGE_OFFSET_BLOB, PAGE_OFFSET_BLOB_END) of every row of the
    `.db` beside the data file `data_path`.

    Raises:
        ShardFormatError: the file is missing, a link leading out of its folder, not SQLite, lacks the
            tables, names another data file than `data_path` in SHARD_NAME, or holds non-integers.
    """
    directory, name = os.path.split(data_path)
    db_path = file_inside(directory, name + MINDRECORD_INDEX_SUFFIX, data_path, entry="its index")
    if not os.path.isfile(db_path):
        raise ShardFormatError(f"{db_path}: no such file (every MindRecord data file needs its .db)")
    try:
        with sqlite3.connect(f"file:{db_path}?mode=ro", uri=True) as db:
            shard_names = db.execute("SELECT NAME FROM SHARD_NAME").fetchall()
            rows = db.execute(
                "SELECT ROW_ID, PAGE_ID_BLOB, PAGE_OFFSET_BLOB, PAGE_OFFSET_BLOB_END FROM INDEXES ORDER BY ROW_ID"
            ).fetchall()
        db.close()
    except sqlite3.Error as error:
        raise ShardFormatError(f"{db_path}: not a MindRecord index ({error})") from None
    # MindSpore reads the data file this names: it must be the one beside it, nothing else.
    if shard_names != [(name,)]:
        listed = [row[0] for row in shard_names]
        raise ShardFormatError(f"{db_path}: SHARD_NAME names {listed!r}, not its data file {name!r}")
    if not all(_is_int(value) for row in rows for value in row):
        raise ShardFormatError(f"{db_path}: INDEXES holds a value that is not an integer")
    try:
        return np.array(rows, dtype=np.int64).reshape(-1, 4)
    except OverflowError:
        raise ShardFormatError(f"{db_path}: INDEXES holds an integer beyond int64") from None


def _check_index_against_pages(db_path: str, index: np.ndarray, pages: np.ndarray) -> None:
    """The `.db` must list exactly the rows the header's pages hold, each in its page, back to back
    from the page's start to its used end (so a deleted, added or moved row is found).

    Args:
        db_path: the `.db`, for messages.
        index: int64 [R, 4] from `_read_index`.
        pages: int64 [P, 4] from `_blob_pages`.

    Raises:
        ShardFormatError: naming the first row that disagrees.
    """
    num_rows = int(pages[-1, 2]) if len(pages) else 0
    if len(index) != num_rows:
        raise ShardFormatError(f"{db_path}: INDEXES has {len(index)} rows, but the data file's pages hold {num_rows}")
    if not len(index):
        return
    row_page = np.repeat(np.arange(len(pages)), pages[:, 2] - pages[:, 1])
    first_in_page = np.zeros(num_rows, dtype=bool)
    first_in_page[pages[pages[:, 2] > pages[:, 1], 1]] = True
    expected_start = np.where(first_in_page, 0, np.concatenate([[0], index[:-1, 3]]))
    last_in_page = np.zeros(num_rows, dtype=bool)
    last_in_page[pages[pages[:, 2] > pages[:, 1], 2] - 1] = True
    problems = (
        (index[:, 0] != np.arange(num_rows), 0, "has ROW_ID {}"),
        (index[:, 1] != pages[row_page, 0], 1, "is in page {}, but the header's pages put it in another"),
        (index[:, 2] != expected_start, 2, "starts at page offset {}, not where the row before it ends"),
        (index[:, 3] < index[:, 2] + LENGTH_PREFIX_BYTES, 3, "ends at page offset {}, before its length prefix ends"),
        (last_in_page & (index[:, 3] != pages[row_page, 3]), 3, "ends at page offset {}, not at its page's used end"),
    )
    for bad, column, text in problems:
        rows = np.flatnonzero(bad)
        if rows.size:
            row = int(rows[0])
            raise ShardFormatError(f"{db_path}: row {row} " + text.format(index[row, column]))


class _ShardView:
    """One data file being read: its memory map and the blob offset of every row."""

    def __init__(self, path: str, header: dict, field_index: int, num_fields: int) -> None:
        self.path = path
        pages = _blob_pages(path, header)
        index = _read_index(path)
        _check_index_against_pages(path + MINDRECORD_INDEX_SUFFIX, index, pages)
        page_starts = header["header_size"] + index[:, 1] * header["page_size"]
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else b""
        self.data = np.frombuffer(self._map, dtype=np.uint8)
        frame_starts = page_starts + index[:, 2]
        blob_starts = frame_starts + LENGTH_PREFIX_BYTES
        blob_sizes = index[:, 3] - index[:, 2] - LENGTH_PREFIX_BYTES
        blob_ends = blob_starts + blob_sizes
        framed = self._little_endian(frame_starts) if len(index) else blob_sizes
        if (framed != blob_sizes).any():
            row = int(np.flatnonzero(framed != blob_sizes)[0])
            raise ShardFormatError(f"{path}: row {row}'s length prefix at offset {frame_starts[row]} says "
                                   f"{framed[row]} bytes, but the .db gives it {blob_sizes[row]}")
        # (start, size) of every blob field: the whole blob, or a walk over [u64 BE len][bytes] pieces
        self.fields = []
        position = blob_starts
        for field in range(num_fields if num_fields > 1 else 0):
            self._check_inside(position + LENGTH_PREFIX_BYTES, blob_ends, f"field {field}'s length prefix")
            sizes = self._big_endian(position, LENGTH_PREFIX_BYTES)
            self._check_inside(position + LENGTH_PREFIX_BYTES + sizes, blob_ends, f"field {field}")
            self.fields.append((position + LENGTH_PREFIX_BYTES, sizes))
            position = position + LENGTH_PREFIX_BYTES + sizes
        if num_fields == 1:
            self.fields.append((blob_starts, blob_sizes))
        elif len(index) and (position != blob_ends).any():
            raise ShardFormatError(f"{path}: blob field lengths do not add up to the blob sizes in the .db")
        self.token_field = field_index
        starts, sizes = self.fields[field_index]
        if (sizes < COUNT_BYTES).any():
            row = int(np.flatnonzero(sizes < COUNT_BYTES)[0])
            raise ShardFormatError(f"{path}: row {row}'s {TOKENS_FIELD} is {sizes[row]} bytes, too short for its count")
        self.token_counts = self._big_endian(starts, COUNT_BYTES)

    def _check_inside(self, ends: np.ndarray, blob_ends: np.ndarray, what: str) -> None:
        """Refuse a walk over a row's fields that steps past the row's blob (`what` names the step)."""
        outside = np.flatnonzero((ends > blob_ends) | (ends < 0))
        if outside.size:
            raise ShardFormatError(f"{self.path}: row {int(outside[0])}'s {what} runs past the end of its blob")

    def _little_endian(self, starts: np.ndarray) -> np.ndarray:
        raw = self.data[starts[:, None] + np.arange(LENGTH_PREFIX_BYTES)].astype(np.uint64)
        values = (raw << (np.uint64(8) * np.arange(LENGTH_PREFIX_BYTES, dtype=np.uint64))).sum(axis=1)
        # A prefix beyond int64 cannot equal a real size; clip it so the comparison stays in int64.
        return np.minimum(values, np.uint64(np.iinfo(np.int64).max)).astype(np.int64)

    def _big_endian(self, starts: np.ndarray, width: int) -> np.ndarray:
        raw = self.data[starts[:, None] + np.arange(width)].astype(np.uint64)
        values = (raw << (np.uint64(8) * np.arange(width - 1, -1, -1, dtype=np.uint64))).sum(axis=1)
        return np.minimum(values, np.uint64(np.iinfo(np.int64).max)).astype(np.int64)

    def decode(
        self, first: int, last: int, field: int, dtype: np.dtype | type = np.int64
    ) -> tuple[np.ndarray, np.ndarray]:
        """Rows `[first, last)` of blob field number `field`: (`dtype` values, int64 counts per row)."""
        starts, sizes = self.fields[field]
        try:
            return decompress_int_rows(self.data, starts[first:last], sizes[first:last], dtype)
        except ShardFormatError as error:
            raise ShardFormatError(f"{self.path}: {error}") from None


def _written_in_several_calls(header: dict) -> bool:
    """Whether one shard's pages show several MindSpore `write_raw_data` calls: one call writes all
    its blob pages, then its raw pages; a later call's new blob pages come after those raw pages."""
    blob_ids = [page.get("page_id", -1) for page in header["page"] if page.get("page_type") == "BLOB_DATA"]
    raw_ids = [page.get("page_id", -1) for page in header["page"] if page.get("page_type") == "RAW_DATA"]
    return bool(blob_ids and raw_ids) and max(blob_ids) > min(raw_ids)


def _check_document_order(path: str, shard_paths: list[str], headers: list[dict], row_counts: list[int]) -> None:
    """Refuse a multi-shard dataset whose document order is lost.

    MindSpore cuts each `write_raw_data` call into consecutive near-equal parts, one per shard, so the
    shards read in turn give the documents in order only when the dataset was written in one call
    (tokenmill always writes so). Several calls leave row counts that differ by more than one, or blob
    pages after raw pages; which rows came from which call is recorded nowhere.

    Raises:
        ShardFormatError: naming the evidence.
    """
    if len(shard_paths) < 2:
        return
    if max(row_counts) - min(row_counts) > 1:
        counts = ", ".join(map(str, row_counts))
        raise ShardFormatError(
            f"{path}: its {len(shard_paths)} shards hold {counts} rows (more than one apart): written by "
            "several write_raw_data calls, each spread over all shards, so the document order is lost; "
            "write it in one call or with one shard"
        )
    for shard_path, header in zip(shard_paths, headers):
        if _written_in_several_calls(header):
            raise ShardFormatError(
                f"{shard_path}: blob pages follow raw pages: written by several write_raw_data calls, each "
                "spread over all shards, so the document order is lost; write it in one call or with one shard"
            )


class MindRecordReader(RowDocumentsReader):
    """Reads a MindRecord token dataset (ours or MindSpore's): every shard, in shard order, which is
    the document order of a dataset written in one `write_raw_data` call (as tokenmill writes them).

    Args:
        path: the dataset's name (`x.mindrecord`, also when its shards are `x.mindrecord0` ..) or any
            one data file (`x.mindrecord3`); the siblings come from the header.

    Raises:
        ShardFormatError: a file is missing or damaged, there is no integer-array `input_ids` field, or
            a multi-shard dataset was written in several calls (its document order is lost).
    """

    def __init__(self, path: str) -> None:
        self.path = str(path)
        opened = first_data_file(self.path)
        first_header = read_header(opened)
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
        addresses = first_header["shard_addresses"]
        if os.path.basename(opened) not in addresses:
            raise ShardFormatError(f"{opened}: its header lists the shards {addresses}, not this file "
                                   "(MindRecord files must keep the names they were written with)")
        self.paths = [file_inside(directory, name, opened, entry=f"header shard_addresses[{number}]")
                      for number, name in enumerate(addresses)]
        self._shards, headers = [], []
        for shard_id, shard_path in enumerate(self.paths):
            header = read_header(shard_path) if shard_path != os.path.abspath(opened) else first_header
            if header["shard_addresses"] != addresses or header.get("shard_id", shard_id) != shard_id:
                raise ShardFormatError(f"{shard_path}: its header does not name it shard {shard_id} of {addresses}")
            self._shards.append(_ShardView(shard_path, header, blob_fields.index(TOKENS_FIELD), len(blob_fields)))
            headers.append(header)
        _check_document_order(self.path, self.paths, headers, [len(s.token_counts) for s in self._shards])
        self._row_starts = np.concatenate([[0], np.cumsum([len(s.token_counts) for s in self._shards])])
        row_tokens = concat_int64([s.token_counts for s in self._shards])
        if LENGTHS_FIELD in blob_fields:
            lengths_field = blob_fields.index(LENGTHS_FIELD)
            decoded = [s.decode(0, len(s.token_counts), lengths_field) for s in self._shards]
            lengths = concat_int64([d[0] for d in decoded])
            counts = concat_int64([d[1] for d in decoded])
            self.sequence_lengths, self.document_indices = row_structure(self.path, row_tokens, lengths, counts)
        else:
            self.sequence_lengths, self.document_indices = row_structure(self.path, row_tokens, None, None)
        self._build_offsets()
        if self.num_tokens != int(row_tokens.sum()):
            raise ShardFormatError(f"{self.path}: the {LENGTHS_FIELD} field does not add up to the tokens")

    def read_rows(self, first: int, last: int) -> np.ndarray:
        parts = []
        for shard, start in zip(self._shards, self._row_starts[:-1].tolist()):
            lo, hi = max(first - start, 0), min(last - start, len(shard.token_counts))
            if lo < hi:
                parts.append(shard.decode(lo, hi, shard.token_field, self.dtype)[0])
        # Rows of one shard (the common case) need no copy.
        return parts[0] if len(parts) == 1 else np.concatenate([np.zeros(0, self.dtype), *parts])
