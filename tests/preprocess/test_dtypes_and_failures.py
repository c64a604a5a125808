"""Token dtype boundaries through the CLI, and failed or interrupted runs that leave nothing complete."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from indexed_dataset import IndexedDataset, IndexedDatasetWriter, TokenmillError
from preprocess import PreprocessConfig, cli, preprocess_data
from preprocess.tokenizers import TokenizerConfig
from preprocess_testing import GPT2_FLAGS, REPO, SAMPLE, read_bytes, write_jsonl


def null_run(tmp_path, vocab_size: int, text: str, *flags: str) -> int:
    source = write_jsonl(str(tmp_path / "in.jsonl"), [{"text": text}])
    return cli.main(["--input", source, "--output-prefix", str(tmp_path / "out"), "--tokenizer-type",
                     "NullTokenizer", "--vocab-size", str(vocab_size), *flags])


@pytest.mark.parametrize(
    ("vocab_size", "rule", "dtype"),
    [
        (65499, "megatron", np.uint16), (65500, "megatron", np.int32), (65536, "megatron", np.int32),
        (65537, "megatron", np.int32), (65499, "tight", np.uint16), (65500, "tight", np.uint16),
        (65536, "tight", np.uint16), (65537, "tight", np.int32),
    ],
)
def test_dtype_follows_the_vocab_size_rule(tmp_path, vocab_size, rule, dtype):
    largest = vocab_size - 1
    assert null_run(tmp_path, vocab_size, f"0 {largest}", "--append-eod", "--token-dtype-rule", rule) == 0
    dataset = IndexedDataset(str(tmp_path / "out_text_document"))
    assert dataset.dtype == np.dtype(dtype)
    assert dataset[0].tolist() == [0, largest, largest]  # eod = vocab_size - 1


@pytest.mark.parametrize(
    ("vocab_size", "text", "rule"),
    [(1000, "1 65536", "megatron"), (1000, "5 -1", "megatron"), (65536, "65536", "tight"),
     (70000, str(2**31), "megatron")],
)
def test_ids_that_do_not_fit_the_dtype_fail_and_leave_nothing(tmp_path, capsys, files_in, vocab_size, text, rule):
    assert null_run(tmp_path, vocab_size, text, "--token-dtype-rule", rule) == 1
    assert "does not fit" in capsys.readouterr().err
    assert files_in() == ["in.jsonl"]


@pytest.mark.parametrize(("text", "reason"), [("1 two 3", "needs space-separated integers"),
                                              (f"1 {2**70}", "id out of the int64 range")])
def test_bad_text_for_null_tokenizer_names_the_line(tmp_path, capsys, text, reason):
    assert null_run(tmp_path, 100, text) == 1
    assert f"in.jsonl:1: key 'text': NullTokenizer {reason}" in capsys.readouterr().err


def config(tmp_path, **overrides) -> PreprocessConfig:
    fields = dict(input=SAMPLE, output_prefix=str(tmp_path / "out"), chunk_bytes=50_000,
                  tokenizer=TokenizerConfig(tokenizer_type=GPT2_FLAGS[1], vocab_file=GPT2_FLAGS[3],
                                            merge_file=GPT2_FLAGS[5]))
    return PreprocessConfig(**{**fields, **overrides})


def test_an_exception_mid_run_leaves_no_output(tmp_path, monkeypatch, files_in):
    calls = []
    original = IndexedDatasetWriter.add_documents

    def failing(self, *args):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("injected")
        return original(self, *args)

    monkeypatch.setattr(IndexedDatasetWriter, "add_documents", failing)
    with pytest.raises(RuntimeError, match="injected"):
        preprocess_data(config(tmp_path, partitions=2))
    assert files_in() == []


def test_a_full_disk_is_one_line_naming_the_file_and_leaves_no_output(tmp_path, monkeypatch, capsys, files_in):
    def full(self, *args):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), self.prefix + ".bin")

    monkeypatch.setattr(IndexedDatasetWriter, "add_documents", full)
    assert null_run(tmp_path, 100, "1 2 3") == 1
    err = capsys.readouterr().err
    path = tmp_path / "out_text_document.bin"
    assert err == f"preprocess-data: error: [Errno 28] No space left on device: '{path}'\n"
    assert files_in() == ["in.jsonl"]


def test_a_failed_run_keeps_an_earlier_complete_output_untouched(tmp_path, files_in):
    preprocess_data(config(tmp_path))
    before = read_bytes(str(tmp_path / "out_text_document.idx"))
    bad = write_jsonl(str(tmp_path / "bad.jsonl"), [{"text": "fine"}], [b"broken\n"])
    with pytest.raises(TokenmillError):
        preprocess_data(config(tmp_path, input=bad))
    assert read_bytes(str(tmp_path / "out_text_document.idx")) == before
    # The earlier run's outputs and their done marker stay: the failed run published nothing.
    assert files_in() == ["bad.jsonl", "out_done", "out_text_document.bin", "out_text_document.idx"]


@pytest.fixture
def big_input(tmp_path):
    """~20 MB of JSON lines, long enough to interrupt a run."""
    path = tmp_path / "big.jsonl"
    path.write_bytes(read_bytes(SAMPLE) * 20)
    return str(path)


@pytest.mark.timeout(120)
def test_killing_the_process_mid_run_leaves_no_complete_looking_output(tmp_path, big_input):
    prefix = str(tmp_path / "out")
    env = {**os.environ, "PYTHONPATH": REPO}
    process = subprocess.Popen(
        [sys.executable, "-m", "preprocess.cli", "--input", big_input, "--output-prefix", prefix, *GPT2_FLAGS,
         "--chunk-bytes", "100000"], env=env, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while not any(name.endswith(".tmp") for name in os.listdir(tmp_path)):  # the writer has started
        assert process.poll() is None and time.monotonic() < deadline
        time.sleep(0.01)
    process.send_signal(signal.SIGKILL)
    process.wait()
    leftovers = os.listdir(tmp_path)
    assert "out_text_document.idx" not in leftovers and "out_text_document.bin" not in leftovers
    # What is left is hidden temporaries only.
    assert all(name.startswith(".") for name in leftovers if name != "big.jsonl")


def _encoder_processes() -> list[int]:
    """Pids of this process's encoder processes (fresh interpreters, started from any of its threads)."""
    pids = []
    for thread in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{thread}/children") as f:
            pids += [int(pid) for pid in f.read().split()]
    return pids


@pytest.mark.timeout(120)
def test_a_dead_worker_fails_the_run_instead_of_hanging(tmp_path, big_input, files_in):
    outcome = {}

    def run():
        try:
            preprocess_data(config(tmp_path, input=big_input, workers=2, chunk_bytes=20_000))
        except TokenmillError as error:
            outcome["error"] = str(error)

    thread = threading.Thread(target=run)
    thread.start()
    deadline = time.monotonic() + 60
    while not _encoder_processes():  # the workers have started
        assert thread.is_alive() and time.monotonic() < deadline
        time.sleep(0.01)
    os.kill(_encoder_processes()[0], signal.SIGKILL)
    thread.join(timeout=60)
    assert not thread.is_alive()
    assert "worker process died" in outcome["error"]
    assert files_in() == ["big.jsonl"]
