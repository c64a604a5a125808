"""Parsing a chunk of JSON lines into text columns, strictly, with `file:line:` errors.

The fast path hands the whole chunk to Arrow's multi-threaded C++ JSON reader with a fixed schema
(each key a string) and takes the columns zero-copy. Arrow is more lenient than Python's `json`
(it skips blank lines, for one) and its errors do not name the line, so the fast path is only
trusted when it yields exactly one row per line, no nulls and valid UTF-8; any doubt sends the chunk
to the exact path: one `json.loads` per line, which also handles a list of strings under a key
(already-split sentences) and names the first bad line, or skips bad lines when asked to.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.json as pa_json

from .errors import InputError

if TYPE_CHECKING:
    from .inputs import JsonLinesChunk

# Arrow parses in blocks and fails on a line that straddles two; one block per chunk avoids that.
_MIN_BLOCK_BYTES = 1 << 20
_JSON_TYPE_NAMES = {dict: "an object", list: "an array", str: "a string", int: "a number", float: "a number",
                    bool: "a boolean", type(None): "null"}
# A byte-order mark some Windows tools put at the start of a file; accepted there only.
UTF8_BOM = b"\xef\xbb\xbf"
# How many skipped line numbers a summary quotes.
SKIPPED_LINES_QUOTED = 5


@dataclass(frozen=True)
class TextColumn:
    """One key's texts for a run of documents.

    Attributes:
        pieces: the texts; a document's string is one piece, a list of strings is one piece each.
        piece_counts: int64 [D] pieces per document, or None when every document has exactly one.
    """

    pieces: pa.LargeStringArray
    piece_counts: np.ndarray | None = None


@dataclass
class ParsedChunk:
    """The documents of one chunk.

    Attributes:
        source: the input file.
        line_numbers: int64 [D], 1-based line of each document.
        columns: one TextColumn per JSON key.
        skipped: (line, reason) of the invalid lines skipped (only when skipping is on).
    """

    source: str
    line_numbers: np.ndarray
    columns: dict[str, TextColumn]
    skipped: list[tuple[int, str]] = field(default_factory=list)

    @property
    def num_documents(self) -> int:
        return len(self.line_numbers)


def _count_lines(data: bytes) -> int:
    return data.count(b"\n") + (0 if data.endswith(b"\n") else 1)


def _parse_fast(data: bytes, keys: tuple[str, ...]) -> dict[str, pa.LargeStringArray] | None:
    """Columns of a chunk whose every line is an object with a string under each key, else None."""
    schema = pa.schema([(key, pa.large_string()) for key in keys])
    try:
        table = pa_json.read_json(
            pa.BufferReader(data),
            read_options=pa_json.ReadOptions(use_threads=False, block_size=max(len(data) + 1, _MIN_BLOCK_BYTES)),
            parse_options=pa_json.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore"),
        )
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    if table.num_rows != _count_lines(data):
        return None
    columns = {}
    for key in keys:
        chunked = table.column(key)
        # One block per chunk gives one Arrow chunk: take it as is (combine_chunks would copy).
        column = chunked.chunk(0) if chunked.num_chunks == 1 else chunked.combine_chunks()
        if column.null_count:
            return None
        try:
            column.validate(full=True)  # checks UTF-8
        except pa.ArrowInvalid:
            return None
        columns[key] = column
    return columns


def _document_pieces(line: bytes, keys: tuple[str, ...]) -> list[list[str]]:
    """Each key's pieces in one line.

    Raises:
        ValueError: the line is invalid; the message says why.
    """
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(f"invalid UTF-8 at byte {error.start}") from None
    if not text.strip():
        raise ValueError("empty line, expected a JSON object")
    try:
        document = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"not valid JSON: {error.msg} at column {error.colno}") from None
    if not isinstance(document, dict):
        raise ValueError(f"expected a JSON object, got {_JSON_TYPE_NAMES.get(type(document), 'a value')}")
    pieces = []
    for key in keys:
        if key not in document:
            raise ValueError(f"missing key {key!r}")
        value = document[key]
        if isinstance(value, str):
            value = [value]
        elif not (isinstance(value, list) and all(isinstance(piece, str) for piece in value)):
            raise ValueError(
                f"key {key!r} holds {_JSON_TYPE_NAMES.get(type(value), 'a value')}, "
                "expected a string or a list of strings"
            )
        for piece in value:
            try:
                piece.encode("utf-8")
            except UnicodeEncodeError:
                raise ValueError(f"key {key!r} holds an invalid \\u escape (lone surrogate)") from None
        pieces.append(value)
    return pieces


def _parse_exact(chunk: JsonLinesChunk, keys: tuple[str, ...], skip_invalid: bool) -> ParsedChunk:
    lines = chunk.data.split(b"\n")
    if chunk.data.endswith(b"\n"):
        lines.pop()
    if chunk.first_line == 1 and lines[0].startswith(UTF8_BOM):  # as Arrow's fast path does
        lines[0] = lines[0][len(UTF8_BOM) :]
    line_numbers, skipped = [], []
    per_key: list[list[list[str]]] = [[] for _ in keys]
    for offset, line in enumerate(lines):
        number = chunk.first_line + offset
        try:
            pieces = _document_pieces(line, keys)
        except ValueError as error:
            if not skip_invalid:
                raise InputError(f"{chunk.source}:{number}: {error}") from None
            skipped.append((number, str(error)))
            continue
        line_numbers.append(number)
        for column, value in zip(per_key, pieces):
            column.append(value)
    columns = {
        key: TextColumn(
            pa.array([piece for document in documents for piece in document], type=pa.large_string()),
            np.fromiter((len(document) for document in documents), dtype=np.int64, count=len(documents)),
        )
        for key, documents in zip(keys, per_key)
    }
    return ParsedChunk(chunk.source, np.array(line_numbers, dtype=np.int64), columns, skipped)


def parse_json_lines(chunk: JsonLinesChunk, keys: tuple[str, ...], skip_invalid: bool = False) -> ParsedChunk:
    """The documents of a chunk of JSON lines.

    Args:
        chunk: whole lines of one file.
        keys: the JSON keys to extract; each must hold a string or a list of strings.
        skip_invalid: skip invalid lines (recorded in `skipped`) instead of failing.

    Raises:
        InputError: `file:line: reason` for the first invalid line, unless skipping.
    """
    columns = _parse_fast(chunk.data, keys)
    if columns is None:
        return _parse_exact(chunk, keys, skip_invalid)
    count = next(iter(columns.values())).__len__()
    line_numbers = np.arange(chunk.first_line, chunk.first_line + count, dtype=np.int64)
    return ParsedChunk(chunk.source, line_numbers, {key: TextColumn(column) for key, column in columns.items()})
