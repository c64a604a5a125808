"""preprocess-data --rank/--world-size: contiguous blocks of the sorted files, part outputs that merge into
the single-process bytes, done markers that make a rerun resume, a killed rank redone."""

from __future__ import annotations

import logging
import glob
import os
import signal
import subprocess
import sys
import time

import pytest

from preprocess import cli, merge_cli
from preprocess.config import PreprocessConfig
from preprocess.fanout import rank_files, rank_from_environment
from preprocess.tokenizers import TokenizerConfig
from preprocess_testing import REPO, same_dataset, write_jsonl

NULL_FLAGS = ["--tokenizer-type", "NullTokenizer", "--vocab-size", "1000"]
NUM_FILES = 7
# Seconds a test waits for a subprocess event before failing.
WAIT_SECONDS = 60
POLL_SECONDS = 0.05


def make_inputs(directory) -> list[str]:
    os.makedirs(directory, exist_ok=True)
    return [write_jsonl(os.path.join(directory, f"shard{k:02d}.jsonl"),
                        [{"text": " ".join(str((k * 31 + i * 7 + j) % 1000) for j in range(i % 11))}
                         for i in range(40 + k)])
            for k in range(NUM_FILES)]


def argv(inputs_dir, prefix, *flags) -> list[str]:
    return ["--input", str(inputs_dir), "--output-prefix", str(prefix), *NULL_FLAGS, "--append-eod",
            "--output-format", "mmap", "arrow", *flags]


def test_ranks_take_contiguous_blocks_covering_every_file_once():
    paths = [f"f{i}" for i in range(10)]
    for world_size in (1, 3, 4, 10, 13):
        blocks = [rank_files(paths, rank, world_size) for rank in range(world_size)]
        assert [p for block in blocks for p in block] == paths
        assert max(map(len, blocks)) - min(map(len, blocks)) <= 1


def test_rank_and_world_size_come_from_torchrun_or_srun():
    srun_task = {"SLURM_PROCID": "1", "SLURM_NTASKS": "8", "SLURM_STEP_NUM_TASKS": "8"}
    assert rank_from_environment({"RANK": "2", "WORLD_SIZE": "4", **srun_task}) == (2, 4)
    assert rank_from_environment(srun_task) == (1, 8)
    # An sbatch script itself is one process, although Slurm tells it SLURM_NTASKS.
    assert rank_from_environment({"SLURM_PROCID": "0", "SLURM_NTASKS": "8"}) == (0, 1)
    assert rank_from_environment({}) == (0, 1)


def test_part_names_sort_in_rank_order():
    def part(rank: int) -> str:
        config = PreprocessConfig(input="x.jsonl", output_prefix="out/c", rank=rank, world_size=12,
                                  tokenizer=TokenizerConfig(tokenizer_type="NullTokenizer", vocab_size=10))
        return config.output_prefix_of("text")

    assert part(2) == "out/c_part02-of-12_text_document"
    assert sorted(part(rank) for rank in range(12)) == [part(rank) for rank in range(12)]


def test_parts_merge_into_the_single_process_bytes_and_rerun_resumes(tmp_path, capsys, caplog):
    inputs = make_inputs(tmp_path / "in")
    assert cli.main(argv(tmp_path / "in", tmp_path / "single")) == 0
    (tmp_path / "parts").mkdir()
    for rank in range(3):
        assert cli.main(argv(tmp_path / "in", tmp_path / "parts" / "c", "--rank", str(rank), "--world-size", "3")) == 0
    assert sorted(os.listdir(tmp_path / "parts" / "c_done")) == [f"c_part{r}-of-3.done" for r in range(3)]
    assert merge_cli.main(["--input", str(tmp_path / "parts"), "--output-prefix", str(tmp_path / "merged")]) == 0
    assert same_dataset(str(tmp_path / "merged"), str(tmp_path / "single_text_document"))

    part = tmp_path / "parts" / "c_part1-of-3_text_document.bin"
    before = part.stat().st_mtime_ns
    caplog.set_level(logging.INFO, logger="preprocess")
    assert cli.main(argv(tmp_path / "in", tmp_path / "parts" / "c", "--rank", "1", "--world-size", "3")) == 0
    assert "Already done" in caplog.text and part.stat().st_mtime_ns == before

    write_jsonl(inputs[3], [{"text": "9 9 9"}])  # rank 1 holds files 2..3
    assert cli.main(argv(tmp_path / "in", tmp_path / "parts" / "c", "--rank", "1", "--world-size", "3")) == 1
    assert "--overwrite" in capsys.readouterr().err
    assert cli.main(argv(tmp_path / "in", tmp_path / "parts" / "c", "--rank", "1", "--world-size", "3",
                         "--overwrite")) == 0
    assert part.stat().st_mtime_ns != before


def _files_under(path) -> dict[str, bytes]:
    """Relative name -> bytes of a dataset's files (a folder's files, or a file and its .db)."""
    if os.path.isdir(path):
        return {name: open(os.path.join(path, name), "rb").read() for name in sorted(os.listdir(path))}
    return {suffix: open(str(path) + suffix, "rb").read() for suffix in ("", ".db")}


def test_every_format_of_the_parts_merges_into_the_single_process_bytes(tmp_path):
    """mmap, Arrow (with a kept field) and MindRecord parts of 3 ranks, merged from their directory,
    are byte for byte the outputs of one process over the same files."""
    os.makedirs(tmp_path / "in")
    for k in range(NUM_FILES):
        write_jsonl(str(tmp_path / "in" / f"shard{k:02d}.jsonl"),
                    [{"text": " ".join(str((k * 13 + i + j) % 1000) for j in range(i % 7)), "id": f"{k}-{i}"}
                     for i in range(30 + k)])
    formats = ["--output-format", "mmap", "arrow", "mindrecord", "--keep-fields", "id"]
    assert cli.main(argv(tmp_path / "in", tmp_path / "single", *formats)) == 0
    (tmp_path / "parts").mkdir()
    for rank in range(3):
        assert cli.main(argv(tmp_path / "in", tmp_path / "parts" / "c", *formats, "--rank", str(rank),
                             "--world-size", "3")) == 0
    # The same stem as the single run: a MindRecord header stores its own file name.
    (tmp_path / "merged").mkdir()
    merged = tmp_path / "merged" / "single_text_document"
    assert merge_cli.main(["--input", str(tmp_path / "parts"), "--output-prefix", str(merged)]) == 0

    assert same_dataset(str(merged), str(tmp_path / "single_text_document"))
    for suffix in ("_arrow", ".mindrecord"):
        assert _files_under(f"{merged}{suffix}") == _files_under(tmp_path / f"single_text_document{suffix}"), suffix


def test_a_rank_without_files_writes_empty_parts(tmp_path):
    make_inputs(tmp_path / "in")
    assert cli.main(argv(tmp_path / "in", tmp_path / "c", "--rank", "0", "--world-size", "8",
                         "--output-format", "mmap")) == 0
    assert os.path.getsize(tmp_path / "c_part0-of-8_text_document.bin") == 0


def _preprocess_process(inputs, prefix, rank, environment) -> subprocess.Popen:
    # Small chunks: rank 1 writes its first file's documents before it blocks on the pipe.
    return subprocess.Popen([sys.executable, "-m", "preprocess.cli", *argv(inputs, prefix), "--chunk-bytes", "200"],
                            env={**environment, "RANK": str(rank), "WORLD_SIZE": "3"},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _wait_for(condition, what: str, process: subprocess.Popen) -> None:
    """Poll `condition` until it holds, failing with `process`'s stderr if it ends first."""
    deadline = time.monotonic() + WAIT_SECONDS
    while not condition():
        if process.poll() is not None:
            pytest.fail(f"exit {process.returncode} before {what}: {process.stderr.read().decode()}")
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(POLL_SECONDS)


def _open_pipe_for_writing(path: str, reader: subprocess.Popen):
    """The pipe's write end, once `reader` opened the other end (failing, not hanging, if it died first)."""
    deadline = time.monotonic() + WAIT_SECONDS
    while True:
        assert reader.poll() is None, reader.stderr.read().decode()
        try:
            descriptor = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        except OSError:  # ENXIO: no reader yet
            if time.monotonic() > deadline:
                pytest.fail("timed out waiting for rank 1 to open its pipe")
            time.sleep(POLL_SECONDS)
            continue
        os.set_blocking(descriptor, True)
        return os.fdopen(descriptor, "wb")


def _staged_names(parts) -> list[str]:
    """What rank 1 has written so far: the files in its hidden staging directory."""
    return [name for staging in glob.glob(str(parts / ".c_part1-of-3.staging-*.tmp")) for name in os.listdir(staging)]


def test_a_killed_rank_is_redone_by_the_same_command(tmp_path):
    """Rank 1 reads its last file from a pipe the test holds open: it is killed once its part files exist
    (mid-way), the pipe is replaced by the real file, the same command is rerun for every rank, and the merge
    equals a single-process run."""
    inputs = make_inputs(tmp_path / "in")
    assert cli.main(argv(tmp_path / "in", tmp_path / "single")) == 0
    fifo = inputs[3]  # rank 1's files: shard02, shard03
    content = open(fifo, "rb").read()
    os.remove(fifo)
    os.mkfifo(fifo)
    environment = {**os.environ, "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", "")}
    parts = tmp_path / "parts"
    parts.mkdir()
    processes = [_preprocess_process(tmp_path / "in", parts / "c", rank, environment) for rank in range(3)]
    writer = _open_pipe_for_writing(fifo, processes[1])
    try:
        writer.write(content[: len(content) // 2])
        writer.flush()
        _wait_for(lambda: any(n.startswith(".c_part1-of-3_text_document.bin") for n in _staged_names(parts))
                  and "c_part1-of-3_text_document_arrow" in _staged_names(parts), "rank 1's part files",
                  processes[1])
        processes[1].send_signal(signal.SIGKILL)
        assert processes[1].wait(WAIT_SECONDS) == -signal.SIGKILL
    finally:
        writer.close()
    for rank in (0, 2):
        assert processes[rank].wait(WAIT_SECONDS) == 0, processes[rank].stderr.read().decode()
    assert not os.path.exists(parts / "c_done" / "c_part1-of-3.done")
    os.remove(fifo)
    with open(fifo, "wb") as f:
        f.write(content)

    for rank in range(3):
        assert cli.main(argv(tmp_path / "in", parts / "c", "--rank", str(rank), "--world-size", "3")) == 0
    assert sorted(n for n in os.listdir(parts) if n.startswith(".")) == []
    assert merge_cli.main(["--input", str(parts), "--output-prefix", str(tmp_path / "merged")]) == 0
    assert same_dataset(str(tmp_path / "merged"), str(tmp_path / "single_text_document"))
