"""Finding input files and cutting them into line-aligned chunks of raw bytes.

`--input` may be a file, a glob pattern or a directory (every `.jsonl`/`.json`, plain or `.gz`, in
sorted order). Files are read in large blocks and cut at the last newline, so a chunk holds whole
lines; the chunk records its file and first line number for error messages. Nothing is decoded here:
parsing happens in the workers (see `jsonl.py`).

A chunk is what travels to a worker: it is picklable and has `source`, `num_bytes`, `disk_offset`
and `parse(keys, skip_invalid) -> ParsedChunk`. Other formats (Parquet row groups, Arrow record
batches, zstd streams) slot in as further chunk kinds and readers with the same shape.
"""

from __future__ import annotations

import glob
import gzip
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass

from .errors import InputError
from .jsonl import ParsedChunk, parse_json_lines

logger = logging.getLogger(__name__)

JSON_SUFFIXES = (".jsonl", ".json")
GZIP_SUFFIX = ".gz"
# 1 MiB of JSON per task: large enough that per-chunk overheads vanish (~100 chunks per 100 MB), small
# enough that the chunks in flight keep memory flat.
DEFAULT_CHUNK_BYTES = 2**20
_NEWLINE = b"\n"


def is_json_lines_file(path: str) -> bool:
    name = path[: -len(GZIP_SUFFIX)] if path.endswith(GZIP_SUFFIX) else path
    return name.endswith(JSON_SUFFIXES)


def resolve_input_files(spec: str) -> list[str]:
    """The input files `spec` names: a file, a directory (its JSON-lines files) or a glob pattern.

    Raises:
        InputError: nothing matches.
    """
    if os.path.isfile(spec):
        return [spec]
    if os.path.isdir(spec):
        paths = sorted(os.path.join(spec, name) for name in os.listdir(spec) if is_json_lines_file(name))
        if not paths:
            raise InputError(f"{spec}: directory holds no .jsonl/.json(.gz) files")
        return paths
    paths = sorted(path for path in glob.glob(spec) if os.path.isfile(path))
    if not paths:
        raise InputError(f"{spec}: no such file, directory or matching files")
    return paths


@dataclass(frozen=True)
class JsonLinesChunk:
    """Whole lines of one JSON-lines file.

    Attributes:
        source: the file's path.
        first_line: 1-based number of the chunk's first line in the file.
        data: the raw bytes (whole lines; the last one may lack its newline at end of file).
        disk_offset: bytes of the (possibly compressed) input consumed once this chunk was read,
            counted over all input files.
    """

    source: str
    first_line: int
    data: bytes
    disk_offset: int

    @property
    def num_bytes(self) -> int:
        return len(self.data)

    def parse(self, keys: tuple[str, ...], skip_invalid: bool = False) -> ParsedChunk:
        """The chunk's documents (see `parse_json_lines`)."""
        return parse_json_lines(self, keys, skip_invalid)


class JsonLinesReader:
    """Iterates the chunks of all input files in order.

    Args:
        paths: input files, in order.
        chunk_bytes: target chunk size (a chunk is larger only when one line is).
        skip_empty_files: log and skip an empty file instead of failing.

    Attributes:
        total_disk_bytes: summed on-disk size of the inputs.
        empty_files: empty files skipped so far.

    Raises:
        InputError: (while iterating) an input is empty, unreadable, or not valid gzip.
    """

    def __init__(self, paths: list[str], chunk_bytes: int = DEFAULT_CHUNK_BYTES, skip_empty_files: bool = False):
        self.paths = paths
        self.chunk_bytes = chunk_bytes
        self.skip_empty_files = skip_empty_files
        self.total_disk_bytes = sum(os.path.getsize(path) for path in paths)
        self.empty_files: list[str] = []

    @property
    def total_bytes(self) -> int | None:
        """Bytes the chunks will hold in all (None when a compressed input hides it)."""
        return None if any(path.endswith(GZIP_SUFFIX) for path in self.paths) else self.total_disk_bytes

    def __iter__(self) -> Iterator[JsonLinesChunk]:
        consumed_before = 0
        for path in self.paths:
            yield from self._file_chunks(path, consumed_before)
            consumed_before += os.path.getsize(path)

    def _file_chunks(self, path: str, consumed_before: int) -> Iterator[JsonLinesChunk]:
        compressed = path.endswith(GZIP_SUFFIX)
        try:
            raw = open(path, "rb")
        except OSError as error:
            raise InputError(f"{path}: cannot open: {error.strerror}") from None
        with raw, (gzip.GzipFile(fileobj=raw, mode="rb") if compressed else raw) as f:
            line = 1
            carry = b""
            while True:
                try:
                    block = f.read(self.chunk_bytes)
                except (OSError, EOFError, gzip.BadGzipFile) as error:
                    raise InputError(f"{path}: cannot read: {error}") from None
                if not block:
                    break
                data = carry + block
                cut = data.rfind(_NEWLINE) + 1
                if cut == 0:  # one line longer than a block: keep reading it
                    carry = data
                    continue
                carry = data[cut:]
                yield JsonLinesChunk(path, line, data[:cut], consumed_before + raw.tell())
                line += data.count(_NEWLINE, 0, cut)
            if carry:
                yield JsonLinesChunk(path, line, carry, consumed_before + raw.tell())
            elif line == 1:
                self._empty(path)

    def _empty(self, path: str) -> None:
        if not self.skip_empty_files:
            raise InputError(f"{path}: empty file")
        logger.warning("%s: empty file, skipped", path)
        self.empty_files.append(path)
