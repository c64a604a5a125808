"""Finding the input files and cutting them into chunks, in sorted path order.

`--input` takes any number of files, glob patterns and directories. Each is expanded (a directory
to its supported files, a `save_to_disk` folder to the `.arrow` files its `state.json` lists), the
union is sorted by path (duplicates dropped), and documents keep that order. Supported files:

    .jsonl / .json           JSON lines, plain, `.gz` or `.zst` (pyarrow's zstd codec: no `zstandard` needed)
    .parquet                 read in record batches of the key (and kept-field) columns
    .arrow                   Arrow IPC, file ("ARROW1" magic) or stream format (`save_to_disk` shards)

JSON-lines files are read in large blocks cut at the last newline (`JsonLinesChunk`: raw bytes,
parsed in the workers, see `jsonl.py`); columnar files in record batches (`columnar.py`). Every
chunk kind is picklable and has `source`, `num_bytes`, `disk_offset`,
`parse(keys, skip_invalid, fields) -> ParsedChunk` and `location(number)` (`file:line` or
`file:row N`). Workers see chunks, never files, so their number does not depend on the number of files.
"""

from __future__ import annotations

import glob
import gzip
import io
import logging
import os
import select
import stat
from collections.abc import Iterator, Sequence

import pyarrow as pa

from indexed_dataset.arrow import saved_dataset_files
from indexed_dataset.names import ARROW_STATE_FILE

from .columnar import arrow_file_chunks, parquet_chunks
from .errors import InputError
from .jsonl import JsonLinesChunk, count_newlines

logger = logging.getLogger(__name__)

JSON_SUFFIXES = (".jsonl", ".json")
COMPRESSIONS = {".gz": "gzip", ".zst": "zstd"}
PARQUET_SUFFIX = ".parquet"
ARROW_SUFFIX = ".arrow"
# 1 MiB of JSON per task: large enough that per-chunk overheads vanish (~100 chunks per 100 MB), small
# enough that the chunks in flight keep memory flat.
DEFAULT_CHUNK_BYTES = 2**20
# The longest JSON line read (MiB, `--max-line-mb`). A line is held whole while it is read, parsed and
# tokenized (~4x its size in all); without a bound, input that never brings a newline (a stream of one
# endless line, a file whose newlines were lost) would grow memory until the machine gives out. Real
# documents are far shorter: whole books are a few MiB.
DEFAULT_MAX_LINE_MB = 256
_MIB = 2**20
_NEWLINE = b"\n"
# How long a named pipe may stay without a writer before the run stops (seconds). Opening a pipe blocks
# until a writer opens it; a writer that never comes would hang the run. Generous: the producer of
# `mkfifo p.jsonl; zcat x.gz > p.jsonl & preprocess-data --input p.jsonl` may start after us.
PIPE_WRITER_WAIT_S = 120.0


def _split_compression(path: str) -> tuple[str, str | None]:
    """(the name without a compression suffix, the compression or None)."""
    for suffix, compression in COMPRESSIONS.items():
        if path.endswith(suffix):
            return path[: -len(suffix)], compression
    return path, None


def input_kind(path: str) -> str | None:
    """"jsonl", "parquet" or "arrow" for a supported input file name, else None."""
    name, compression = _split_compression(path)
    if name.endswith(JSON_SUFFIXES):
        return "jsonl"
    if compression is None and name.endswith(PARQUET_SUFFIX):
        return "parquet"
    if compression is None and name.endswith(ARROW_SUFFIX):
        return "arrow"
    return None


def _directory_files(directory: str) -> list[str]:
    if os.path.isfile(os.path.join(directory, ARROW_STATE_FILE)):
        return saved_dataset_files(directory)
    paths = [os.path.join(directory, name) for name in os.listdir(directory)]
    paths = [path for path in paths if not os.path.isdir(path) and input_kind(path)]
    if not paths:
        raise InputError(f"{directory}: directory holds no .jsonl/.json(.gz/.zst), .parquet or .arrow files")
    return paths


def _check_file_type(path: str) -> None:
    """A regular file, or a named pipe of JSON lines (read as a stream); anything else (a device, a socket,
    a pipe of Parquet or Arrow, which are read with seeks) is refused.

    Raises:
        InputError: naming the path and its type.
    """
    mode = os.stat(path).st_mode
    if stat.S_ISREG(mode) or (stat.S_ISFIFO(mode) and input_kind(path) == "jsonl"):
        return
    what = "a named pipe" if stat.S_ISFIFO(mode) else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) \
        else "a socket" if stat.S_ISSOCK(mode) else "not a regular file"
    raise InputError(f"{path}: is {what}; inputs are regular files (a named pipe only for .jsonl/.json)")


def _expand(spec: str) -> list[str]:
    if os.path.exists(spec) and not os.path.isdir(spec):  # a file, or a named pipe
        if input_kind(spec) is None:
            raise InputError(f"{spec}: unsupported input; expected .jsonl/.json (.gz/.zst), .parquet or .arrow")
        _check_file_type(spec)
        return [spec]
    if os.path.isdir(spec):
        return _directory_files(spec)
    matches = sorted(glob.glob(spec))
    paths = [path for match in matches for path in
             (_directory_files(match) if os.path.isdir(match) else [match] if input_kind(match) else [])]
    if not paths:
        raise InputError(f"{spec}: no such file, directory or matching input files")
    for path in paths:
        _check_file_type(path)
    return paths


def resolve_inputs(specs: str | Sequence[str]) -> list[str]:
    """The input files named by `specs` (files, glob patterns, directories), sorted by path, each once.

    Raises:
        InputError: a spec matches nothing, or names an unsupported file.
    """
    specs = [specs] if isinstance(specs, str) else list(specs)
    if not specs:
        raise InputError("no input given")
    return sorted({os.path.normpath(path) for spec in specs for path in _expand(spec)})


def zstd_available() -> bool:
    """Whether pyarrow was built with the zstd codec (the wheels on PyPI are)."""
    return pa.Codec.is_available("zstd")


class _CountingReader(io.RawIOBase):
    """A binary file that counts the bytes read from it: the on-disk offset, also for a named pipe,
    which has no `tell()`."""

    def __init__(self, file) -> None:
        super().__init__()
        self._file = file
        self.consumed = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        count = self._file.readinto(buffer)
        self.consumed += count
        return count

    def close(self) -> None:
        self._file.close()
        super().close()


def _open_decompressed(path: str, raw, compression: str | None):
    if compression == "gzip":
        return gzip.GzipFile(fileobj=raw, mode="rb")
    if compression == "zstd":
        if not zstd_available():
            raise InputError(f"{path}: this pyarrow build has no zstd codec; decompress the file first")
        return pa.CompressedInputStream(raw, "zstd")
    return raw


def _open_input(path: str) -> io.FileIO:
    """`path` opened for reading, unbuffered; a named pipe once a writer has opened it.

    Raises:
        InputError: a named pipe got no writer within PIPE_WRITER_WAIT_S.
        OSError: it cannot be opened.
    """
    if not stat.S_ISFIFO(os.stat(path).st_mode):
        return open(path, "rb", buffering=0)
    # Opened without blocking, then polled: until a writer comes, poll reports nothing (Linux reports a
    # hang-up only once a writer has come and gone), so the wait is bounded instead of a blocking open's.
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    poller = select.poll()
    poller.register(fd, select.POLLIN | select.POLLHUP)
    if not poller.poll(PIPE_WRITER_WAIT_S * 1000):
        os.close(fd)
        raise InputError(f"{path}: named pipe without a writer for {PIPE_WRITER_WAIT_S:.0f} s; start the "
                         "program that writes it")
    os.set_blocking(fd, True)
    return io.FileIO(fd, "rb")


class InputReader:
    """Iterates the chunks of all input files in order (any supported kind).

    Args:
        paths: input files, in order (see `resolve_inputs`).
        chunk_bytes: target chunk size (a JSON chunk is larger only when one line is).
        skip_empty_files: log and skip an empty file instead of failing.
        columns: the columns a columnar file must provide (keys and kept fields).
        max_line_mb: the longest JSON line read, in MiB (lines that span chunks are measured; a line inside
            one chunk is at most `chunk_bytes` long).

    Attributes:
        total_disk_bytes: summed on-disk size of the inputs.
        empty_files: empty files skipped so far.

    Raises:
        InputError: (while iterating) an input is empty, unreadable, not valid gzip/zstd/Parquet/Arrow, or
            holds a line longer than `max_line_mb`.
    """

    def __init__(
        self,
        paths: list[str],
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        skip_empty_files: bool = False,
        columns: Sequence[str] = (),
        max_line_mb: int = DEFAULT_MAX_LINE_MB,
    ) -> None:
        self.paths = paths
        self.chunk_bytes = chunk_bytes
        self.max_line_mb = max_line_mb
        self.skip_empty_files = skip_empty_files
        self.columns = list(columns)
        self.total_disk_bytes = sum(os.path.getsize(path) for path in paths)
        self.empty_files: list[str] = []

    @property
    def total_bytes(self) -> int | None:
        """Bytes the chunks will hold in all (None when a compressed, columnar or piped input hides it)."""
        plain = all(input_kind(path) == "jsonl" and _split_compression(path)[1] is None and os.path.isfile(path)
                    for path in self.paths)
        return self.total_disk_bytes if plain else None

    def __iter__(self) -> Iterator:
        consumed_before = 0
        for path in self.paths:
            kind = input_kind(path)
            if kind == "jsonl":
                chunks = self._json_chunks(path, consumed_before)
            elif kind == "parquet":
                chunks = parquet_chunks(path, self.columns, self.chunk_bytes, consumed_before)
            else:
                chunks = arrow_file_chunks(path, self.columns, self.chunk_bytes, consumed_before)
            empty = True
            for chunk in chunks:
                empty = False
                yield chunk
            if empty:
                self._empty(path)
            consumed_before += os.path.getsize(path)

    def _json_chunks(self, path: str, consumed_before: int) -> Iterator[JsonLinesChunk]:
        try:
            raw = _CountingReader(_open_input(path))
        except OSError as error:
            raise InputError(f"{path}: cannot open: {error.strerror}") from None
        with raw, _open_decompressed(path, io.BufferedReader(raw), _split_compression(path)[1]) as f:
            line = 1
            # The start of a line that spans blocks: its pieces (joined once, when its newline comes) and
            # their length in bytes.
            carry: list[bytes] = []
            carried = 0
            position = 0  # bytes of (decompressed) text read before `block`
            while True:
                try:
                    block = f.read(self.chunk_bytes)
                except (OSError, EOFError, gzip.BadGzipFile, pa.ArrowException) as error:
                    raise InputError(f"{path}: cannot read: {error}") from None
                if not block:
                    break
                cut = block.rfind(_NEWLINE) + 1
                # Only a line carried over from earlier blocks can pass the limit (one inside a block is at
                # most `chunk_bytes` long): its length so far, up to this block's first newline if any.
                if carried and carried + (block.find(_NEWLINE) if cut else len(block)) > self.max_line_mb * _MIB:
                    raise InputError(f"{path}:{line}: the line starting at byte {position - carried} is longer "
                                     f"than {self.max_line_mb} MiB (--max-line-mb): a file whose newlines were "
                                     "lost, or a stream without one?")
                position += len(block)
                if cut == 0:  # one line longer than a block: keep reading it
                    carry.append(block)
                    carried += len(block)
                    continue
                # One copy of the chunk's bytes (the carried start of its first line, then the block up
                # to its last newline), not two (`carry + block`, then a slice of it).
                data = b"".join((*carry, memoryview(block)[:cut]))
                carry, carried = [block[cut:]], len(block) - cut
                yield JsonLinesChunk(path, line, data, consumed_before + raw.consumed)
                line += count_newlines(data)
            if carried:
                yield JsonLinesChunk(path, line, b"".join(carry), consumed_before + raw.consumed)

    def _empty(self, path: str) -> None:
        if not self.skip_empty_files:
            raise InputError(f"{path}: empty file")
        logger.warning("%s: empty file, skipped", path)
        self.empty_files.append(path)
