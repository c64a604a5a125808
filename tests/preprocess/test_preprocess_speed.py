"""What keeps `preprocess-data` near the bare tokenizer's speed (issue 19): a run loads only what it
uses, the reader cuts chunks with the right line numbers in one copy, and the checks that let a chunk
take Arrow's fast path count its lines and refuse exactly what the input rule refuses."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from preprocess.inputs import InputReader
from preprocess.jsonl import MAX_JSON_DEPTH, _fast_path_lines, count_newlines

from preprocess_testing import GPT2_FLAGS, REPO, write_jsonl

# Modules a JSON-lines run writing only mmap outputs never needs: numba comes with the MindRecord
# writer (~0.12 s and ~60 MB to load), pyarrow.compute and pyarrow.parquet with columnar inputs.
NOT_NEEDED_FOR_JSONL_TO_MMAP = ("numba", "pyarrow.compute", "pyarrow.parquet")


def _modules_loaded_by_a_run(tmp_path, *extra: str) -> set[str]:
    """Which of NOT_NEEDED_FOR_JSONL_TO_MMAP a fresh `preprocess-data` process had loaded when it finished."""
    corpus = write_jsonl(str(tmp_path / "in.jsonl"), [{"text": f"document {i} [with] {{brackets}}"} for i in range(50)])
    driver = ("import sys; from preprocess import cli; code = cli.main(sys.argv[2:]); "
              "print(' '.join(m for m in sys.argv[1].split(',') if m in sys.modules)); sys.exit(code)")
    argv = ["--input", corpus, "--output-prefix", str(tmp_path / "out"), *GPT2_FLAGS, "--append-eod", *extra]
    done = subprocess.run([sys.executable, "-c", driver, ",".join(NOT_NEEDED_FOR_JSONL_TO_MMAP), *argv],
                          capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stderr
    return set(done.stdout.split())


def test_a_json_lines_run_to_mmap_loads_neither_numba_nor_the_columnar_readers(tmp_path):
    assert _modules_loaded_by_a_run(tmp_path) == set()


def test_a_mindrecord_output_still_loads_its_writer(tmp_path):
    assert "numba" in _modules_loaded_by_a_run(tmp_path, "--output-format", "mmap", "mindrecord")


@pytest.mark.parametrize("chunk_bytes", [1, 7, 64, 1000, 2**20])
def test_chunks_join_to_the_file_and_each_starts_at_its_line(tmp_path, chunk_bytes):
    lines = [b'{"text": "short"}\n', b'{"text": "' + b"long " * 100 + b'"}\n', b"\n", b'{"text": "no newline at end"}']
    path = tmp_path / "in.jsonl"
    path.write_bytes(b"".join(lines))
    chunks = list(InputReader([str(path)], chunk_bytes))
    assert b"".join(chunk.data for chunk in chunks) == path.read_bytes()
    line_starts = [sum(len(line) for line in lines[:number]) for number in range(len(lines))]
    offset = 0
    for chunk in chunks:
        assert line_starts[chunk.first_line - 1] == offset
        assert chunk.data.endswith(b"\n") or chunk is chunks[-1]
        offset += chunk.num_bytes


def test_count_newlines_counts_newline_bytes():
    assert [count_newlines(data) for data in (b"", b"a", b"\n", b"a\nb\n\n", "é\n".encode())] == [0, 0, 1, 3, 1]


def test_the_fast_path_takes_good_lines_and_counts_them():
    lines = [json.dumps({"text": text}).encode() for text in ("a", " leading space", "[{nested}]", "")]
    assert _fast_path_lines(b"\n".join(lines) + b"\n") == 4
    assert _fast_path_lines(b"\n".join(lines)) == 4  # no newline after the last line
    assert _fast_path_lines(b' {"text": "whitespace before an object is JSON"}\n') == 1


@pytest.mark.parametrize("data", [
    b"",
    b"\n",
    b'{"text": "a"}\n\n{"text": "b"}\n',  # Arrow would skip the blank line ...
    b'{"text": "a"}\n \t\r\n{"text": "b"}\n',  # ... and a line of whitespace
    b'{"text": "a"} {"text": "b"}\n\n',  # two objects on a line hide a blank line from a row count
    b'{"text": "\xff"}\n',  # invalid UTF-8
    b'{"text": "a", "meta": ' + b"[" * (MAX_JSON_DEPTH + 1) + b"]" * (MAX_JSON_DEPTH + 1) + b"}\n",
], ids=["empty", "only a newline", "blank line", "whitespace line", "two objects and a blank", "bad utf-8", "deep"])
def test_the_fast_path_refuses_what_arrow_accepts_and_the_rule_does_not(data):
    assert _fast_path_lines(data) is None


def test_brackets_inside_strings_do_not_send_a_chunk_to_the_exact_path():
    many = "[" * (2 * MAX_JSON_DEPTH)
    assert _fast_path_lines(json.dumps({"text": many}).encode() + b"\n") == 1
