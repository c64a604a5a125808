"""Parsing a chunk of JSON lines into text columns, strictly, with `file:line:` errors.

What a valid line is does not depend on how the input is cut into chunks, nor on which parser reads
it: every line must be valid UTF-8 (all of it, also the fields we do not read), one JSON object
nested at most `MAX_JSON_DEPTH` levels deep, with a string or a list of strings under each key (and
a number or string under each kept field). A line is refused (or, with skip_invalid, skipped) by that
rule alone, with the same message whatever its neighbours.

The fast path hands the whole chunk to Arrow's multi-threaded C++ JSON reader with a fixed schema
(each key a string) and takes the columns zero-copy. Arrow is more lenient than the rule (it skips
blank lines, reads past invalid UTF-8 in fields it ignores, nests without limit) and its errors do
not name the line, so the fast path is only taken for a chunk that is valid UTF-8, has no blank line
and no line nested too deep, and only trusted when it yields exactly one row per line and no nulls;
any doubt sends the chunk to the exact path: one `json.loads` per line, which also handles a list of
strings under a key (already-split sentences) and names the first bad line, or skips bad lines when
asked to.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.json as pa_json

from .chunks import ParsedChunk, TextColumn, field_array
from .errors import InputError

# Arrow parses in blocks and fails on a line that straddles two; one block per chunk avoids that.
_MIN_BLOCK_BYTES = 1 << 20
_JSON_TYPE_NAMES = {dict: "an object", list: "an array", str: "a string", int: "a number", float: "a number",
                    bool: "a boolean", type(None): "null"}
# A byte-order mark some Windows tools put at the start of a file; accepted there only.
UTF8_BOM = b"\xef\xbb\xbf"
_INT64_MIN, _INT64_MAX = int(np.iinfo(np.int64).min), int(np.iinfo(np.int64).max)
# How many skipped line numbers a summary quotes.
SKIPPED_LINES_QUOTED = 5
# The deepest nesting of arrays and objects a line may have. Python's json recurses once per level and
# fails near 990 levels (the interpreter's recursion limit of 1000); real documents nest a few levels.
MAX_JSON_DEPTH = 512
# A JSON string (escapes included, written so that a failed match cannot backtrack exponentially) or
# a bracket: scanning these gives the nesting depth without counting brackets inside strings.
_STRING_OR_BRACKET = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]')
_NEWLINE = ord("\n")
# Byte value -> whether it is JSON whitespace (a table: one gather, where np.isin would sort).
_IS_JSON_WHITESPACE = np.zeros(256, dtype=bool)
_IS_JSON_WHITESPACE[list(b" \t\r\n")] = True
# Setting bit 0x20 turns exactly two bytes into `{` (0x7B): `{` itself and `[` (0x5B). So one OR and one
# compare find both opening brackets (two compares and an OR cost a pass more).
_OPENER_CASE_BIT, _OPENER = 0x20, ord("{")


def count_newlines(data: bytes) -> int:
    """How many newline bytes `data` holds (vectorised: ~4x faster than `bytes.count`, which the
    reader would pay for every byte of input on the main thread)."""
    return int(np.count_nonzero(np.frombuffer(data, dtype=np.uint8) == _NEWLINE))


def json_depth(line: bytes) -> int:
    """The deepest nesting of arrays and objects in one line of JSON (brackets inside strings do not count)."""
    depth = deepest = 0
    for match in _STRING_OR_BRACKET.finditer(line):
        bracket = match.group()
        if bracket in (b"[", b"{"):
            depth += 1
            deepest = max(deepest, depth)
        elif bracket in (b"]", b"}"):
            depth -= 1
    return deepest


def is_too_deep(line: bytes) -> bool:
    """Whether a line nests deeper than MAX_JSON_DEPTH (counting brackets first: a line with fewer
    opening brackets than the limit cannot be too deep, and is not scanned)."""
    return line.count(b"{") + line.count(b"[") > MAX_JSON_DEPTH and json_depth(line) > MAX_JSON_DEPTH


def _is_valid_utf8(data: bytes) -> bool:
    """Whether `data` is valid UTF-8, checked by Arrow in place (no decoded copy)."""
    offsets = pa.py_buffer(np.array([0, len(data)], dtype=np.int64))
    try:
        pa.LargeStringArray.from_buffers(1, offsets, pa.py_buffer(data)).validate(full=True)
    except pa.ArrowInvalid:
        return False
    return True


def _fast_path_lines(data: bytes) -> int | None:
    """The number of lines of a chunk Arrow's reader may take, or None when something it would accept
    and the rule refuses may be in it (a blank line, invalid UTF-8, a line nested too deep).

    Vectorised: one UTF-8 check and three passes over the bytes, then work on the few lines that
    may be blank or deep (`bytes.count` and `bytes.strip` over the whole chunk would cost as much as
    Arrow's parse itself: ~0.15 s per 100 MB)."""
    body_length = len(data) - data.endswith(b"\n")
    if not body_length or not _is_valid_utf8(data):
        return None
    body = np.frombuffer(data, dtype=np.uint8, count=body_length)
    separators = np.flatnonzero(body == _NEWLINE)
    line_starts = np.concatenate((np.zeros(1, np.int64), separators + 1))
    line_ends = np.append(separators, body_length)
    # A blank line is empty or starts with whitespace: only those few lines are looked at closely.
    first = body[np.minimum(line_starts, body_length - 1)]
    maybe_blank = (line_starts == line_ends) | _IS_JSON_WHITESPACE[first]
    if any(not data[line_starts[i] : line_ends[i]].strip(b" \t\r") for i in np.flatnonzero(maybe_blank)):
        return None
    openers = np.flatnonzero((body | _OPENER_CASE_BIT) == _OPENER)
    if len(openers) > MAX_JSON_DEPTH:
        # Openers per line: where each line starts among the (sorted) opener positions. Searching the
        # few line starts among the many openers beats placing every opener among the lines.
        per_line = np.diff(np.searchsorted(openers, line_starts), append=len(openers))
        if any(is_too_deep(data[line_starts[i] : line_ends[i]]) for i in np.flatnonzero(per_line > MAX_JSON_DEPTH)):
            return None
    return len(line_starts)


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

    def location(self, line: int) -> str:
        """`file:line`, for messages."""
        return f"{self.source}:{line}"

    def parse(self, keys: tuple[str, ...], skip_invalid: bool = False, fields: tuple[str, ...] = ()) -> ParsedChunk:
        """The chunk's documents (see `parse_json_lines`)."""
        return parse_json_lines(self, keys, skip_invalid, fields)


def _parse_fast(
    data: bytes, keys: tuple[str, ...], fields: tuple[str, ...]
) -> tuple[dict[str, pa.LargeStringArray], dict[str, pa.Array]] | None:
    """(text columns, kept fields) of a chunk whose every line is an object with a string under each
    key and a number or string under each field, else None."""
    lines = _fast_path_lines(data)
    if lines is None:
        return None
    schema = pa.schema([(key, pa.large_string()) for key in keys])
    try:
        table = pa_json.read_json(
            pa.BufferReader(data),
            read_options=pa_json.ReadOptions(use_threads=False, block_size=max(len(data) + 1, _MIN_BLOCK_BYTES)),
            # Kept fields have no fixed type: let Arrow infer the rest (only when fields are kept).
            parse_options=pa_json.ParseOptions(explicit_schema=schema,
                                               unexpected_field_behavior="infer" if fields else "ignore"),
        )
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    if table.num_rows != lines:
        return None
    kept = {}
    for name in fields:
        if name not in table.column_names or table.column(name).null_count:
            return None
        try:
            kept[name] = field_array(table.column(name).combine_chunks(), name)
        except ValueError:
            return None
        if pa.types.is_null(kept[name].type):
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
    return columns, kept


def _document_pieces(
    line: bytes, keys: tuple[str, ...], fields: tuple[str, ...], field_is_text: dict[str, bool]
) -> tuple[list[list[str]], list]:
    """Each key's pieces in one line, and each kept field's value (a string where `field_is_text`
    says earlier lines held one, else a number).

    Raises:
        ValueError: the line is invalid; the message says why.
    """
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(f"invalid UTF-8 at byte {error.start}") from None
    if not text.strip():
        raise ValueError("empty line, expected a JSON object")
    if is_too_deep(line):
        raise ValueError(f"JSON nested deeper than {MAX_JSON_DEPTH} levels")
    try:
        document = json.loads(text)
    except json.JSONDecodeError as error:
        # Some of json's messages end in "at" ("Unterminated string starting at"): no "at at".
        raise ValueError(f"not valid JSON: {error.msg.removesuffix(' at')} at column {error.colno}") from None
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
    values = []
    for name in fields:
        if name not in document:
            raise ValueError(f"missing field {name!r}")
        value = document[name]
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise ValueError(f"field {name!r} holds {_JSON_TYPE_NAMES.get(type(value), 'a value')}, "
                             "expected a number or a string")
        if isinstance(value, int) and not _INT64_MIN <= value <= _INT64_MAX:
            raise ValueError(f"field {name!r} holds {value}, which does not fit int64")
        if name in field_is_text and isinstance(value, str) != field_is_text[name]:
            raise ValueError(f"field {name!r} holds {_JSON_TYPE_NAMES[type(value)]}, earlier lines held "
                             f"{'a string' if field_is_text[name] else 'a number'}")
        values.append(value)
    return pieces, values


def _parse_exact(
    chunk: JsonLinesChunk, keys: tuple[str, ...], skip_invalid: bool, fields: tuple[str, ...]
) -> ParsedChunk:
    lines = chunk.data.split(b"\n")
    if chunk.data.endswith(b"\n"):
        lines.pop()
    if chunk.first_line == 1 and lines[0].startswith(UTF8_BOM):  # as Arrow's fast path does
        lines[0] = lines[0][len(UTF8_BOM) :]
    line_numbers, skipped = [], []
    per_key: list[list[list[str]]] = [[] for _ in keys]
    per_field: list[list] = [[] for _ in fields]
    field_is_text: dict[str, bool] = {}  # whether each field held a string on the first valid line
    for offset, line in enumerate(lines):
        number = chunk.first_line + offset
        try:
            pieces, values = _document_pieces(line, keys, fields, field_is_text)
        except ValueError as error:
            if not skip_invalid:
                raise InputError(f"{chunk.source}:{number}: {error}") from None
            skipped.append((number, str(error)))
            continue
        line_numbers.append(number)
        for column, value in zip(per_key, pieces):
            column.append(value)
        for name, column, value in zip(fields, per_field, values):
            column.append(value)
            field_is_text.setdefault(name, isinstance(value, str))
    columns = {
        key: TextColumn(
            pa.array([piece for document in documents for piece in document], type=pa.large_string()),
            np.fromiter((len(document) for document in documents), dtype=np.int64, count=len(documents)),
        )
        for key, documents in zip(keys, per_key)
    }
    # Each field holds only numbers or only strings (checked above): Arrow infers int64, double or string.
    kept = {name: field_array(pa.array(values), name) for name, values in zip(fields, per_field)}
    return ParsedChunk(chunk.source, np.array(line_numbers, dtype=np.int64), columns, skipped, kept)


def parse_json_lines(
    chunk: JsonLinesChunk, keys: tuple[str, ...], skip_invalid: bool = False, fields: tuple[str, ...] = ()
) -> ParsedChunk:
    """The documents of a chunk of JSON lines.

    Args:
        chunk: whole lines of one file.
        keys: the JSON keys to extract; each must hold a string or a list of strings.
        skip_invalid: skip invalid lines (recorded in `skipped`) instead of failing.
        fields: scalar keys passed through; each must hold a number or a string (a missing one is
            an invalid line, as a missing key).

    Raises:
        InputError: `file:line: reason` for the first invalid line, unless skipping.
    """
    fast = _parse_fast(chunk.data, keys, fields)
    if fast is None:
        return _parse_exact(chunk, keys, skip_invalid, fields)
    columns, kept = fast
    count = next(iter(columns.values())).__len__()
    line_numbers = np.arange(chunk.first_line, chunk.first_line + count, dtype=np.int64)
    return ParsedChunk(chunk.source, line_numbers, {key: TextColumn(column) for key, column in columns.items()},
                       fields=kept)
