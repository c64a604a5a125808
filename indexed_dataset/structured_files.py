"""Reading the JSON, JSON-lines and YAML files a user hands us, bounded in size and nesting depth.

A config or data file can be anything: ``/dev/zero`` (an endless read), a FIFO without a writer (an
endless wait), a gigabyte of brackets (Python's parsers recurse once per level: RecursionError), bytes that
are not UTF-8. Every reader here refuses those in one line naming the file (and the byte offset or line)
before parsing:

    config = read_json_file("run/config.json", CONFIG_FILE_LIMIT_BYTES)
    text = read_bounded_text("lambada.jsonl", DATA_FILE_LIMIT_BYTES)
    record = parse_json(line, f"lambada.jsonl line {number}")
    options = read_yaml_file("run.yaml", CONFIG_FILE_LIMIT_BYTES)

It lives in the lowest room so that every room's readers share it. Failures raise ``error`` (default
`StructuredFileError`), so each caller keeps its own error type; a file that cannot be opened raises the
OSError, whose message names the path.
"""

from __future__ import annotations

import json
import os
import re
import stat
from collections.abc import Callable
from typing import Any

from .errors import TokenmillError

MIB = 2**20
CONFIG_FILE_LIMIT_BYTES = 64 * MIB
"""Config-like files (YAML and DeepSpeed configs, config.json, tokenizer_config.json, a shard index,
model_config.json): the largest we know, a big model's safetensors index, is a few MiB."""
DATA_FILE_LIMIT_BYTES = 4096 * MIB
"""Data and record files read whole (SQuAD: ~40 MiB, LAMBADA: ~2 MiB, a long run's metrics.jsonl)."""
# One read call's size: Linux returns at most ~2 GiB per read, so a large file is read in pieces.
READ_CHUNK_BYTES = 16 * MIB
MAX_NESTING_DEPTH = 100
"""Deepest nesting of objects/lists we parse: our files nest at most ~6 levels (SQuAD: data, paragraphs,
qas, answers); 100 leaves room and stays far below Python's recursion limit (1000), which the JSON and
YAML parsers would otherwise hit as a RecursionError."""

# A JSON string (skipped: brackets inside it do not nest) or one bracket.
_JSON_TOKEN = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]', re.DOTALL)
_OPENERS = frozenset("[{")


class StructuredFileError(TokenmillError, ValueError):
    """A JSON/YAML file is too large, not a regular file, not UTF-8, nested too deep or malformed."""


def read_bounded_bytes(path: str | os.PathLike, limit_bytes: int,
                       error: type[Exception] = StructuredFileError) -> bytes:
    """The bytes of the regular file ``path``, at most ``limit_bytes`` of them.

    Opened without blocking (a FIFO with no writer would wait forever) and checked to be a regular file
    before anything is read; never reads more than ``limit_bytes + 1`` bytes (``/dev/zero`` is endless).

    Raises:
        error: not a regular file, or larger than ``limit_bytes``.
        OSError: the file cannot be opened or read (its message names the path).
    """
    descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        info = os.fstat(descriptor)
        if not stat.S_ISREG(info.st_mode):
            raise error(f"{path}: not a regular file (a {_kind(info.st_mode)})")
        if info.st_size > limit_bytes:
            raise error(f"{path}: {info.st_size} bytes, more than the {limit_bytes} this file may hold")
        data = _read_at_most(descriptor, limit_bytes + 1)
    finally:
        os.close(descriptor)
    if len(data) > limit_bytes:  # it grew while we looked
        raise error(f"{path}: more than the {limit_bytes} bytes this file may hold")
    return data


def _read_at_most(descriptor: int, count: int) -> bytes:
    """Up to ``count`` bytes from ``descriptor`` (fewer only at the end of the file)."""
    chunks, left = [], count
    while left > 0:
        chunk = os.read(descriptor, min(left, READ_CHUNK_BYTES))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "directory"), (stat.S_ISFIFO, "FIFO"), (stat.S_ISCHR, "character device"),
                       (stat.S_ISBLK, "block device"), (stat.S_ISSOCK, "socket")):
        if test(mode):
            return name
    return "special file"


def read_bounded_text(path: str | os.PathLike, limit_bytes: int, error: type[Exception] = StructuredFileError) -> str:
    """The UTF-8 text of the regular file ``path`` (`read_bounded_bytes`'s bounds).

    Raises:
        error: as `read_bounded_bytes`, or bytes that are not UTF-8 (naming the byte offset).
        OSError: the file cannot be opened or read.
    """
    data = read_bounded_bytes(path, limit_bytes, error)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as decode_error:
        raise error(f"{path}: not UTF-8 text (byte offset {decode_error.start}: "
                    f"{decode_error.reason})") from None


def check_json_depth(text: str, where: str, max_depth: int = MAX_NESTING_DEPTH,
                     error: type[Exception] = StructuredFileError) -> None:
    """Refuse JSON ``text`` nested deeper than ``max_depth`` (a scan of its brackets, outside strings).

    Raises:
        error: naming ``where`` and the character offset of the first bracket too deep.
    """
    if text.count("[") + text.count("{") <= max_depth:  # cannot nest that deep: skip the scan
        return
    depth = 0
    for token in _JSON_TOKEN.finditer(text):
        symbol = token.group()
        if symbol in _OPENERS:
            depth += 1
            if depth > max_depth:
                raise error(f"{where}: nested deeper than {max_depth} levels (at character {token.start()})")
        elif symbol in "]}":
            depth -= 1


def parse_json(text: str, where: str, max_depth: int = MAX_NESTING_DEPTH,
               error: type[Exception] = StructuredFileError) -> Any:
    """One JSON value (a JSON-lines record, say), depth-checked first.

    Raises:
        error: ``{where}: not JSON (...)`` or nested too deep.
    """
    return _loads(text, where, max_depth, error,
                  lambda decode_error: f"not JSON ({decode_error.msg} at column {decode_error.colno})")


def read_json_file(path: str | os.PathLike, limit_bytes: int = CONFIG_FILE_LIMIT_BYTES,
                   max_depth: int = MAX_NESTING_DEPTH, error: type[Exception] = StructuredFileError) -> Any:
    """The JSON value of the file ``path``, bounded in size and depth.

    Raises:
        error: too large, not a regular file, not UTF-8, nested too deep, or not valid JSON (naming the line
            and column).
        OSError: the file cannot be opened or read.
    """
    return _loads(read_bounded_text(path, limit_bytes, error), str(path), max_depth, error,
                  lambda decode_error: f"not valid JSON at line {decode_error.lineno}, column "
                                       f"{decode_error.colno}: {decode_error.msg}")


def _loads(text: str, where: str, max_depth: int, error: type[Exception],
           describe: Callable[[json.JSONDecodeError], str]) -> Any:
    """``json.loads(text)``, depth-checked first; a decoding error is ``{where}: {describe(error)}``."""
    check_json_depth(text, where, max_depth, error)
    try:
        return json.loads(text)
    except json.JSONDecodeError as decode_error:
        raise error(f"{where}: {describe(decode_error)}") from None
    except RecursionError:  # a parser deeper than our scan saw (never expected): still one line
        raise error(f"{where}: nested too deep to parse") from None


def read_yaml_file(path: str | os.PathLike, limit_bytes: int = CONFIG_FILE_LIMIT_BYTES,
                   max_depth: int = MAX_NESTING_DEPTH, error: type[Exception] = StructuredFileError) -> Any:
    """The YAML value of the file ``path`` (``yaml.safe_load``: plain data only), bounded in size and depth.

    The depth is counted on the parser's event stream (which does not recurse) before the value is built
    (which does). A key given twice in one mapping is refused: ``safe_load`` would keep the last silently,
    and a config that says two things has no one meaning.

    Raises:
        error: too large, not a regular file, not UTF-8, nested too deep, a key given twice, or not valid YAML
            (naming the line and column).
        OSError: the file cannot be opened or read.
    """
    import yaml  # only the commands that read YAML need it

    text = read_bounded_text(path, limit_bytes, error)
    try:
        depth = 0
        for event in yaml.parse(text, Loader=yaml.SafeLoader):
            if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
                depth += 1
                if depth > max_depth:
                    mark = event.start_mark
                    raise error(f"{path}: nested deeper than {max_depth} levels (at line {mark.line + 1}, "
                                f"column {mark.column + 1})")
            elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
                depth -= 1
        return yaml.load(text, Loader=_unique_keys_loader(yaml, path, error))
    except yaml.YAMLError as yaml_error:
        mark = getattr(yaml_error, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(yaml_error, "problem", None) or "malformed"
        raise error(f"{path}: not valid YAML{at}: {problem}") from None
    except RecursionError:
        raise error(f"{path}: nested too deep to parse") from None



def _unique_keys_loader(yaml, path: str | os.PathLike, error: type[Exception]) -> type:
    """A ``yaml.SafeLoader`` (plain data only) that refuses a key given twice in one mapping."""

    class UniqueKeysLoader(yaml.SafeLoader):
        def construct_mapping(self, node, deep=False):
            seen = set()
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=deep)
                if not isinstance(key, (str, int, float, bool)):
                    continue  # an unhashable key: the base constructor reports it
                if key in seen:
                    raise error(f"{path}: line {key_node.start_mark.line + 1}: {key!r} is given twice")
                seen.add(key)
            return super().construct_mapping(node, deep=deep)

    return UniqueKeysLoader
