"""The shortcuts that keep `preprocess-data` near the bare tokenizer's speed (issue 19) change no byte:
ids leave the encoder as uint16 with the eods inserted in the same copy, gigatoken encodes a batch on
the calling thread where our threads already fill the cores, the per-line depth check still finds the
one line nested too deep, encoder processes exit without teardown once every result is sent, and the
program ends without the interpreter's teardown yet loses no line, no exit code and no output."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from preprocess import workers
from preprocess.cli import main
from preprocess.documents import COMPACT_DTYPE, EncodeSettings, assemble_documents, compact_dtype, encode_chunk
from preprocess.inputs import InputReader
from preprocess.jsonl import MAX_JSON_DEPTH, _fast_path_lines
from preprocess.tokenizers import TokenizerConfig, build_tokenizer
from preprocess.tokenizers.giga import encode_batch_with

from preprocess_testing import (GPT2_FLAGS, GPT2_MERGES, GPT2_VOCAB, REPO, SAMPLE, same_dataset, sample_texts,
                                 write_jsonl)

EOD = 50256


def _reference_documents(tokens: np.ndarray, lengths: np.ndarray, eod: int | None) -> np.ndarray:
    """One document per piece, empty ones dropped, eod after each (np.insert: the previous code)."""
    if eod is None:
        return tokens
    ends = np.cumsum(lengths[lengths > 0])
    return np.insert(tokens, ends, np.asarray(eod, dtype=tokens.dtype))


@settings(max_examples=150, deadline=None)
@given(lengths=st.lists(st.integers(0, 6), max_size=12), eod=st.sampled_from([None, EOD]),
       high=st.sampled_from([EOD, 65535, 65536, 2**31]))
def test_compact_ids_are_the_same_ids_with_eods_in_the_same_places(lengths, eod, high):
    lengths = np.array(lengths, dtype=np.int64)
    tokens = np.random.default_rng(len(lengths)).integers(0, high, int(lengths.sum()), endpoint=True).astype(np.uint32)
    dtype = compact_dtype(tokens, eod)
    got = assemble_documents(tokens, lengths, None, eod, dtype)
    expected = _reference_documents(tokens, lengths, eod)
    assert got.tokens.dtype == (COMPACT_DTYPE if (not tokens.size or tokens.max() <= 65535) else np.uint32)
    assert got.tokens.astype(np.int64).tolist() == expected.astype(np.int64).tolist()


def test_ids_that_do_not_fit_uint16_keep_their_dtype_and_values():
    assert compact_dtype(np.array([1, 70000], dtype=np.uint32), EOD) == np.uint32
    assert compact_dtype(np.array([1, 2], dtype=np.uint32), 70000) == np.uint32  # the eod must fit too
    assert compact_dtype(np.array([-1, 2], dtype=np.int64), None) == np.int64  # negative ids are not narrowed
    assert compact_dtype(np.array([3, 2], dtype=np.int64), None) == COMPACT_DTYPE
    assert compact_dtype(np.zeros(0, dtype=np.uint32), EOD) == COMPACT_DTYPE


def _nested(levels: int) -> bytes:
    return b'{"text": "x", "meta": ' + b"[" * (levels - 1) + b"]" * (levels - 1) + b"}"


@pytest.mark.parametrize("deep_line", [0, 2, 4])
def test_the_depth_check_counts_the_openers_of_each_line(deep_line):
    shallow = json.dumps({"text": "[[[", "meta": [[1]] * 200}).encode()  # 202 openers, 3 levels deep
    lines = [shallow] * 5  # > MAX_JSON_DEPTH openers in the chunk, none in a line too deep
    lines[1] = _nested(MAX_JSON_DEPTH)  # as deep as allowed
    assert _fast_path_lines(b"\n".join(lines) + b"\n") == 5
    lines[deep_line] = _nested(MAX_JSON_DEPTH + 1)
    assert _fast_path_lines(b"\n".join(lines) + b"\n") is None


def test_gigatoken_batches_spread_over_its_pool_only_with_cores_to_spare(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(2)), raising=False)
    assert not workers.spread_batches(workers.IN_PROCESS_THREADS)  # 2 cores, 2 threads of ours: serial
    assert not workers.spread_batches(1)  # one of several encoder processes: one core each
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)), raising=False)
    assert workers.spread_batches(workers.IN_PROCESS_THREADS)
    assert not workers.spread_batches(1)


def test_encoder_processes_start_openblas_on_one_thread_unless_the_user_chose(monkeypatch):
    monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
    assert workers._encoder_environment()["OPENBLAS_NUM_THREADS"] == "1"
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "4")
    assert workers._encoder_environment()["OPENBLAS_NUM_THREADS"] == "4"


def test_serial_and_pooled_gigatoken_batches_give_the_same_ids():
    tokenizer = build_tokenizer(TokenizerConfig(tokenizer_type="GPT2BPETokenizer", vocab_file=GPT2_VOCAB,
                                                merge_file=GPT2_MERGES))
    texts = sample_texts() * 20  # past gigatoken's smallest parallel batch
    encoded = {parallel: encode_batch_with(tokenizer.backend, texts, parallel) for parallel in (False, True, None)}
    for parallel in (True, None):
        assert np.array_equal(encoded[parallel].tokens, encoded[False].tokens)
        assert np.array_equal(encoded[parallel].offsets, encoded[False].offsets)


def test_encoder_processes_send_every_result_then_exit_cleanly():
    config = TokenizerConfig(tokenizer_type="GPT2BPETokenizer", vocab_file=GPT2_VOCAB, merge_file=GPT2_MERGES)
    settings = EncodeSettings(keys=("text",), eod=EOD)
    chunks = list(InputReader([SAMPLE], 300))
    pool = workers._ProcessPool(2, config, settings, 1, workers.DEFAULT_ENCODER_MEMORY_LIMIT_MB)
    try:
        encoded = list(pool.map_ordered(chunks))
    finally:
        pool.close(kill=False)
    local = build_tokenizer(config)
    for got, chunk in zip(encoded, chunks, strict=True):
        expected = encode_chunk(chunk, local, settings).columns["text"]
        assert got.columns["text"].tokens.tolist() == expected.tokens.tolist()
        assert got.columns["text"].tokens.dtype == COMPACT_DTYPE
    assert [worker.process.returncode for worker in pool.started] == [0, 0]


def _program(argv: list[str]) -> subprocess.CompletedProcess:
    """`python -m preprocess.cli argv` (the program: it ends itself, without teardown)."""
    return subprocess.run([sys.executable, "-m", "preprocess.cli", *argv], capture_output=True, text=True, cwd=REPO,
                          timeout=300, env={**os.environ, "PYTHONPATH": REPO})


@pytest.mark.parametrize("workers_flag", [[], ["--workers", "2"]])
def test_the_program_writes_the_bytes_of_an_in_process_run_and_logs_its_last_line(tmp_path, workers_flag):
    corpus = write_jsonl(str(tmp_path / "in.jsonl"), [{"text": text} for text in sample_texts()])
    flags = ["--input", corpus, *GPT2_FLAGS, "--append-eod", "--chunk-bytes", "300", *workers_flag]
    assert main([*flags, "--output-prefix", str(tmp_path / "in_process")]) == 0
    done = _program([*flags, "--output-prefix", str(tmp_path / "program")])
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith(f"Done: {len(sample_texts())} documents")
    assert same_dataset(str(tmp_path / "program_text_document"), str(tmp_path / "in_process_text_document"))


def test_the_program_still_reports_bad_input_in_one_line_with_its_exit_code(tmp_path):
    corpus = write_jsonl(str(tmp_path / "in.jsonl"), [{"text": "fine"}], raw_lines=[b'{"text": 3}'])
    done = _program(["--input", corpus, "--output-prefix", str(tmp_path / "out"), *GPT2_FLAGS])
    assert done.returncode == 1
    assert done.stderr.strip() == f"preprocess-data: error: {corpus}:2: key 'text' holds a number, " \
                                  "expected a string or a list of strings"
    assert sorted(os.listdir(tmp_path)) == ["in.jsonl"]
