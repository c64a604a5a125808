"""preprocess-data never hangs on an input and never starts more encoder processes than the machine holds
(issue 26, issue 34).

Promised, as a user types the command:

- a named pipe (`.jsonl`) is read as a stream once its writer comes, however late within
  `PIPE_WRITER_WAIT_S`; a pipe that gets no writer in that time is one line naming it and exit 1, never a hang;
- a named pipe of Parquet or Arrow (read with seeks), a device (`/dev/zero` behind a `.jsonl` name): one
  line naming the path and what it is, exit 1, nothing written;
- an empty `--output-prefix`: one line, exit != 0;
- a JSON line longer than `--max-line-mb` (a stream that never brings a newline, a file whose newlines were
  lost) stops the run with one line naming the file, the line and its byte offset, in bounded memory; a line
  of exactly the limit is read;
- `--workers N` beyond the machine's cores or its memory (N encoder processes of up to
  `--encoder-memory-limit-mb` each) is capped, with one warning line naming `--workers` and the cap; the
  output bytes are those of `--workers 1` (a cap changes the speed only, so it warns instead of refusing:
  a command line written for a larger machine still runs).
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import subprocess
import sys
import threading
import time

import pytest

from preprocess_testing import GOLDEN, GPT2_FLAGS, SAMPLE, same_dataset, write_jsonl

COMMAND_TIMEOUT_S = 120
# A broken run must not take the shared machine's memory with it: each command gets this address space.
ADDRESS_SPACE_BYTES = 8 * 2**30
# The shortened writer wait of these tests (seconds), and how late their writer comes.
PIPE_WAIT_S = 2
LATE_WRITER_S = 0.5
NULL_FLAGS = ["--tokenizer-type", "NullTokenizer", "--vocab-size", "1000"]


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE_BYTES, ADDRESS_SPACE_BYTES))


def preprocess(*argv: str, cwd, pipe_wait_s: float | None = None) -> tuple[int, str]:
    """`preprocess-data ARGV` in a fresh process (its pipe wait shortened to `pipe_wait_s`): (exit, stderr)."""
    setup = f"import preprocess.inputs as inputs; inputs.PIPE_WRITER_WAIT_S = {pipe_wait_s}; " if pipe_wait_s else ""
    code = f"import sys; {setup}from preprocess.cli import main; raise SystemExit(main(sys.argv[1:]))"
    result = subprocess.run([sys.executable, "-c", code, *argv], cwd=cwd, capture_output=True, text=True,
                            timeout=COMMAND_TIMEOUT_S, preexec_fn=_limit_memory)
    return result.returncode, result.stderr


def assert_one_line(code: int, err: str, *expected: str) -> None:
    assert code != 0
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, lines
    for text in expected:
        assert text in lines[0], lines[0]


def _pipe(tmp_path, name: str) -> str:
    path = str(tmp_path / name)
    os.mkfifo(path)
    return path


@pytest.mark.timeout(180)
def test_a_named_pipe_without_a_writer_is_one_line(tmp_path, files_in):
    pipe = _pipe(tmp_path, "in.jsonl")
    before = files_in()
    code, err = preprocess("--input", pipe, "--output-prefix", str(tmp_path / "out"), *NULL_FLAGS,
                           cwd=tmp_path, pipe_wait_s=PIPE_WAIT_S)
    assert_one_line(code, err, pipe, "without a writer")
    assert files_in() == before


@pytest.mark.timeout(180)
def test_a_named_pipe_whose_writer_comes_late_is_read(tmp_path):
    pipe = _pipe(tmp_path, "in.jsonl")

    def write_late() -> None:
        time.sleep(LATE_WRITER_S)
        with open(pipe, "wb") as f:  # blocks until the command opens the pipe
            f.write(b'{"text": "1 2 3"}\n{"text": "4"}\n')

    writer = threading.Thread(target=write_late, daemon=True)
    writer.start()
    code, err = preprocess("--input", pipe, "--output-prefix", str(tmp_path / "out"), *NULL_FLAGS,
                           cwd=tmp_path, pipe_wait_s=PIPE_WAIT_S)
    writer.join(COMMAND_TIMEOUT_S)
    assert code == 0, err
    assert "2 documents, 4 tokens" in err


# The line limit of these tests (MiB) and the chunk size that makes a line of that size span many chunks.
LINE_LIMIT_MB = 1
SMALL_CHUNK_BYTES = "65536"
ENDLESS_PIECE = b"x" * 2**16


@pytest.mark.timeout(180)
def test_an_endless_line_from_a_pipe_stops_at_the_line_limit(tmp_path, files_in):
    pipe = _pipe(tmp_path, "in.jsonl")
    stop = threading.Event()

    def write_forever() -> None:
        with open(pipe, "wb") as f, contextlib.suppress(BrokenPipeError):
            f.write(b'{"text": "1 2"}\n{"text": "')
            while not stop.is_set():  # until the command stops reading (or the test is over)
                f.write(ENDLESS_PIECE)

    writer = threading.Thread(target=write_forever, daemon=True)
    writer.start()
    before = files_in()
    try:
        code, err = preprocess("--input", pipe, "--output-prefix", str(tmp_path / "out"), *NULL_FLAGS,
                               "--max-line-mb", str(LINE_LIMIT_MB), cwd=tmp_path, pipe_wait_s=PIPE_WAIT_S)
    finally:
        stop.set()
    writer.join(COMMAND_TIMEOUT_S)
    assert_one_line(code, err, f"{pipe}:2:", "byte 16", f"longer than {LINE_LIMIT_MB} MiB", "--max-line-mb")
    assert files_in() == before


@pytest.mark.timeout(180)
@pytest.mark.parametrize("surplus", [0, 1])
def test_the_line_limit_is_exact(tmp_path, surplus):
    limit = LINE_LIMIT_MB * 2**20
    start, end = b'{"text": "', b'"}'
    long_line = start + b"7 " * ((limit + surplus - len(start) - len(end)) // 2) + b"7" * (surplus % 2) + end
    assert len(long_line) == limit + surplus
    source = write_jsonl(str(tmp_path / "in.jsonl"), [{"text": "1 2"}], [long_line + b"\n", b'{"text": "3"}\n'])
    code, err = preprocess("--input", source, "--output-prefix", str(tmp_path / "out"), *NULL_FLAGS,
                           "--max-line-mb", str(LINE_LIMIT_MB), "--chunk-bytes", SMALL_CHUNK_BYTES, cwd=tmp_path)
    if surplus:
        assert_one_line(code, err, f"{source}:2:", f"byte {len(json.dumps({'text': '1 2'})) + 1}")
    else:
        assert code == 0, err
        assert "3 documents" in err


def _parquet_pipe(tmp_path) -> tuple[str, str]:
    return _pipe(tmp_path, "in.parquet"), "a named pipe"


def _arrow_pipe(tmp_path) -> tuple[str, str]:
    return _pipe(tmp_path, "in.arrow"), "a named pipe"


def _device(tmp_path) -> tuple[str, str]:
    path = tmp_path / "zeros.jsonl"
    path.symlink_to("/dev/zero")
    return str(path), "a device"


def _device_in_a_glob(tmp_path) -> tuple[str, str]:
    (tmp_path / "shards").mkdir()
    write_jsonl(str(tmp_path / "shards" / "a.jsonl"), [{"text": "1"}])
    (tmp_path / "shards" / "b.jsonl").symlink_to("/dev/zero")
    return str(tmp_path / "shards" / "*.jsonl"), "a device"


NOT_FILES = {"parquet_pipe": _parquet_pipe, "arrow_pipe": _arrow_pipe, "device": _device,
             "device_in_a_glob": _device_in_a_glob}


@pytest.mark.timeout(180)
@pytest.mark.parametrize("case", sorted(NOT_FILES))
def test_an_input_that_is_not_a_file_is_one_line(tmp_path, files_in, case):
    spec, what = NOT_FILES[case](tmp_path)
    before = files_in()
    code, err = preprocess("--input", spec, "--output-prefix", str(tmp_path / "out"), *NULL_FLAGS,
                           cwd=tmp_path, pipe_wait_s=PIPE_WAIT_S)
    assert_one_line(code, err, what)
    assert files_in() == before


@pytest.mark.timeout(300)
@pytest.mark.parametrize("workers", ["100000", "4096"])
def test_more_workers_than_the_machine_holds_are_capped_with_one_line(tmp_path, workers):
    prefix = str(tmp_path / "out")
    code, err = preprocess("--input", SAMPLE, "--output-prefix", prefix, *GPT2_FLAGS, "--append-eod",
                           "--workers", workers, "--chunk-bytes", "200000", cwd=tmp_path)
    assert code == 0, err
    assert "Traceback" not in err
    warnings = [line for line in err.splitlines() if f"--workers {workers}" in line]
    assert len(warnings) == 1 and "using" in warnings[0], err
    assert same_dataset(prefix + "_text_document", os.path.join(GOLDEN, "sample_en_eod_text_document"))


@pytest.mark.timeout(120)
def test_an_empty_output_prefix_is_one_line(tmp_path, files_in):
    source = write_jsonl(str(tmp_path / "in.jsonl"), [{"text": "1 2"}])
    before = files_in()
    code, err = preprocess("--input", source, "--output-prefix", "", *NULL_FLAGS, cwd=tmp_path)
    assert_one_line(code, err, "output_prefix is empty")
    assert files_in() == before


@pytest.mark.parametrize(("cores", "available_mib", "requested", "expected"),
                         [(64, 1024, 100000, 2), (2, 64 * 1024, 100000, 2), (64, 100, 8, 1), (8, 64 * 1024, 4, 4)])
def test_the_worker_cap_is_the_cores_and_the_memory_per_encoder(monkeypatch, caplog, cores, available_mib,
                                                                requested, expected):
    from preprocess import workers

    monkeypatch.setattr(workers, "usable_cores", lambda: cores)
    monkeypatch.setattr(workers, "available_memory_bytes", lambda: available_mib * 2**20)
    assert workers.usable_workers(requested, memory_limit_mb=340) == expected
    assert (f"--workers {requested}" in caplog.text) == (expected < requested)
