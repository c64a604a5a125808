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
from .formats import MINDRECORD_INDEX_SUFFIX, RowDocumentsReader, row_structure
from .mindrecord import LENGTHS_FIELD, LENGTH_PREFIX_BYTES, TOKENS_FIELD, U64_LE, VERSION, concat_int64


def read_header(path: str) -> dict:
    """The JSON header of one MindRecord data file.

    Raises:
        ShardFormatError: the file is missing or its header is not MindRecord's.
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
        db_path = path + MINDRECORD_INDEX_SUFFIX
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
        blob_starts = page_starts + index[:, 1] + LENGTH_PREFIX_BYTES
        blob_sizes = index[:, 2] - index[:, 1] - LENGTH_PREFIX_BYTES
        # (start, size) of every blob field: the whole blob, or a walk over [u64 BE len][bytes] pieces
        self.fields = []
        position = blob_starts
        for _ in range(num_fields if num_fields > 1 else 0):
            sizes = self._big_endian(position, LENGTH_PREFIX_BYTES)
            self.fields.append((position + LENGTH_PREFIX_BYTES, sizes))
            position = position + LENGTH_PREFIX_BYTES + sizes
        if num_fields == 1:
            self.fields.append((blob_starts, blob_sizes))
        elif len(index) and (position != blob_starts + blob_sizes).any():
            raise ShardFormatError(f"{path}: blob field lengths do not add up to the blob sizes in the .db")
        self.token_field = field_index
        self.token_counts = self._big_endian(self.fields[field_index][0], COUNT_BYTES)

    def _big_endian(self, starts: np.ndarray, width: int) -> np.ndarray:
        raw = self.data[starts[:, None] + np.arange(width)].astype(np.int64)
        return (raw << (8 * np.arange(width - 1, -1, -1))).sum(axis=1)

    def decode(
        self, first: int, last: int, field: int, dtype: np.dtype | type = np.int64
    ) -> tuple[np.ndarray, np.ndarray]:
        """Rows `[first, last)` of blob field number `field`: (`dtype` values, int64 counts per row)."""
        starts, sizes = self.fields[field]
        try:
            return decompress_int_rows(self.data, starts[first:last], sizes[first:last], dtype)
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
        row_tokens = concat_int64([s.token_counts for s in self._shards])
        if LENGTHS_FIELD in blob_fields:
            lengths_field = blob_fields.index(LENGTHS_FIELD)
            decoded = [s.decode(0, len(s.token_counts), lengths_field) for s in self._shards]
            lengths = concat_int64([d[0] for d in decoded])
            counts = concat_int64([d[1] for d in decoded])
            self.sequence_lengths, self.document_indices = row_structure(row_tokens, lengths, counts)
        else:
            self.sequence_lengths, self.document_indices = row_structure(row_tokens, None, None)
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
