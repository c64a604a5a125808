"""Interrupted and failed preprocessing leaves nothing, and the same command run again works.

Built from the fault-injection campaign of issue 18 §3: kills in the publish window of a run with
several keys and formats, kills of a partitioned run, SIGTERM/SIGINT (with worker processes), and a
disk that fills up (writes raising ENOSPC, also when the writer's buffer is flushed on clean-up).
"""

from __future__ import annotations

import builtins
import errno
import io
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

import indexed_dataset.writer
from indexed_dataset import IndexedDatasetWriter
from indexed_dataset.formats import open_reader
from preprocess import cli
from preprocess_testing import GPT2_FLAGS, REPO, SAMPLE, read_bytes, same_dataset, write_jsonl

KEYS_AND_FORMATS = ["--json-keys", "text", "src", "--output-format", "mmap", "arrow", "mindrecord"]
# Every output, and beside each Arrow and MindRecord one its checksum manifest (indexed_dataset.checksums).
OUTPUTS = sorted(f"out_{key}_document{suffix}" for key in ("text", "src")
                 for suffix in (".bin", ".idx", "_arrow", "_arrow.sha256sums", ".mindrecord", ".mindrecord.db",
                                ".mindrecord.sha256sums"))
WAIT_SECONDS = 60


def _argv(tmp_path, source, *flags: str) -> list[str]:
    return ["--input", str(source), "--output-prefix", str(tmp_path / "out"), *GPT2_FLAGS, *flags]


def _small_input(tmp_path) -> str:
    documents = [{"text": f"Document {i} says hello.", "src": f"source {i}"} for i in range(40)]
    return write_jsonl(str(tmp_path / "in.jsonl"), documents)


def _visible(tmp_path) -> list[str]:
    return sorted(os.listdir(tmp_path))


def _hidden(tmp_path) -> list[str]:
    return [name for name in os.listdir(tmp_path) if name.startswith(".")]


def _same_outputs(first, second) -> bool:
    """Same documents in every output of both directories (mmap byte for byte)."""
    for name in ("out_text_document", "out_src_document"):
        if not same_dataset(str(first / name), str(second / name)):
            return False
        for suffix in ("_arrow", ".mindrecord"):
            a, b = open_reader(str(first / (name + suffix))), open_reader(str(second / (name + suffix)))
            if len(a) != len(b) or any((a[i] != b[i]).any() for i in range(len(a))):
                return False
    return True


def test_the_same_command_after_a_complete_run_succeeds_without_redoing(tmp_path, caplog):
    source = _small_input(tmp_path)
    assert cli.main(_argv(tmp_path, source, *KEYS_AND_FORMATS)) == 0
    before = read_bytes(str(tmp_path / "out_text_document.bin"))
    caplog.clear()
    assert cli.main(_argv(tmp_path, source, *KEYS_AND_FORMATS)) == 0
    assert "Already done" in caplog.text
    assert cli.main(_argv(tmp_path, source, *KEYS_AND_FORMATS, "--overwrite")) == 0
    assert read_bytes(str(tmp_path / "out_text_document.bin")) == before
    assert _visible(tmp_path) == sorted(["in.jsonl", "out_done", *OUTPUTS])
    assert os.listdir(tmp_path / "out_done") == ["out.done"]


def test_another_command_on_the_same_prefix_replaces_every_output(tmp_path):
    source = _small_input(tmp_path)
    assert cli.main(_argv(tmp_path, source, *KEYS_AND_FORMATS)) == 0
    assert cli.main(_argv(tmp_path, source, *KEYS_AND_FORMATS, "--append-eod")) == 0
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    assert cli.main(["--input", source, "--output-prefix", str(fresh / "out"), *GPT2_FLAGS, *KEYS_AND_FORMATS,
                     "--append-eod"]) == 0
    assert _same_outputs(tmp_path, fresh)


def test_a_deleted_output_under_a_done_marker_is_redone(tmp_path):
    source = _small_input(tmp_path)
    assert cli.main(_argv(tmp_path, source, *KEYS_AND_FORMATS)) == 0
    os.remove(tmp_path / "out_src_document.mindrecord")
    assert cli.main(_argv(tmp_path, source, *KEYS_AND_FORMATS)) == 0
    assert _visible(tmp_path) == sorted(["in.jsonl", "out_done", *OUTPUTS])


def _killed_while_publishing(tmp_path, source: str, moves_before_kill: int) -> subprocess.CompletedProcess:
    """Run preprocess-data in a process that SIGKILLs itself after `moves_before_kill` files were
    moved to their final names: the worst moment, when some outputs are complete and others missing."""
    driver = textwrap.dedent(f"""
        import os, signal, sys
        from preprocess import cli, outputs
        real_replace, publish = os.replace, outputs.Outputs.publish
        moves = [0]
        def replace(*args):
            real_replace(*args)
            moves[0] += 1
            if moves[0] == {moves_before_kill}:
                os.kill(os.getpid(), signal.SIGKILL)
        def killing_publish(self):
            os.replace = replace
            publish(self)
        outputs.Outputs.publish = killing_publish
        sys.exit(cli.main(sys.argv[1:]))
    """)
    return subprocess.run([sys.executable, "-c", driver, *_argv(tmp_path, source, *KEYS_AND_FORMATS)],
                          env={**os.environ, "PYTHONPATH": REPO}, capture_output=True, timeout=WAIT_SECONDS)


@pytest.mark.parametrize("moves_before_kill", [1, 4, 9])
def test_a_run_killed_while_publishing_is_redone_by_the_same_command(tmp_path, moves_before_kill):
    source = _small_input(tmp_path)
    killed = _killed_while_publishing(tmp_path, source, moves_before_kill)
    assert killed.returncode == -signal.SIGKILL
    left = _visible(tmp_path)
    assert not os.path.exists(tmp_path / "out_done" / "out.done")  # not marked done: incomplete
    assert not set(OUTPUTS) <= set(left)
    assert cli.main(_argv(tmp_path, source, *KEYS_AND_FORMATS)) == 0
    assert _hidden(tmp_path) == []
    assert _visible(tmp_path) == sorted(["in.jsonl", "out_done", *OUTPUTS])
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    assert cli.main(["--input", source, "--output-prefix", str(fresh / "out"), *GPT2_FLAGS, *KEYS_AND_FORMATS]) == 0
    assert _same_outputs(tmp_path, fresh)


@pytest.fixture
def big_input(tmp_path):
    """~20 MB of JSON lines, long enough to interrupt a run."""
    path = tmp_path / "big.jsonl"
    path.write_bytes(read_bytes(SAMPLE) * 20)
    return str(path)


def _start(tmp_path, source: str, *flags: str) -> subprocess.Popen:
    """preprocess-data in its own process group (so a group signal reaches its workers, not pytest)."""
    # faulthandler: a run that hangs is made to print every thread's stack (`_finish`).
    return subprocess.Popen([sys.executable, "-m", "preprocess.cli", *_argv(tmp_path, source, *flags)],
                            env={**os.environ, "PYTHONPATH": REPO, "PYTHONFAULTHANDLER": "1"},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)


def _finish(process: subprocess.Popen) -> bytes:
    """The run's stderr once it has ended; a run still going after WAIT_SECONDS hangs: fail with the stacks
    of its threads (SIGABRT makes faulthandler print them)."""
    try:
        return process.communicate(timeout=WAIT_SECONDS)[1]
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGABRT)
        err = process.communicate()[1].decode(errors="replace")
        pytest.fail(f"preprocess-data hangs after the signal; its threads:\n{err[-6000:]}")


def _staged_names(tmp_path) -> list[str]:
    staging = [tmp_path / name for name in _hidden(tmp_path) if ".staging-" in name]
    try:
        return [name for folder in staging for name in os.listdir(folder)]
    except FileNotFoundError:  # removed by the run meanwhile
        return []


def _wait_until_staging_holds(tmp_path, process: subprocess.Popen, wanted=lambda name: True) -> None:
    deadline = time.monotonic() + WAIT_SECONDS
    while True:
        if any(wanted(name) for name in _staged_names(tmp_path)):
            return
        assert process.poll() is None and time.monotonic() < deadline, process.stderr.read().decode()
        time.sleep(0.01)


@pytest.mark.timeout(180)
def test_a_killed_partitioned_run_leaves_only_a_hidden_folder_that_the_rerun_removes(tmp_path, big_input):
    flags = ("--partitions", "3", "--chunk-bytes", "100000")
    process = _start(tmp_path, big_input, *flags)
    # The first partial dataset is complete (a pair that would pass --validate): kill now.
    _wait_until_staging_holds(tmp_path, process, lambda name: name.endswith(".partition00000.idx"))
    process.kill()
    process.communicate()
    assert _visible(tmp_path) == sorted(["big.jsonl", *_hidden(tmp_path)])  # nothing visible was written
    assert all(".staging-" in name or name.endswith(".tmp") for name in _hidden(tmp_path))
    assert cli.main(_argv(tmp_path, big_input, *flags)) == 0
    assert _hidden(tmp_path) == []
    assert _visible(tmp_path) == ["big.jsonl", "out_done", "out_text_document.bin", "out_text_document.idx"]


@pytest.mark.timeout(180)
@pytest.mark.parametrize(("signal_number", "exit_code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_signal_ends_the_run_with_one_line_and_leaves_nothing(tmp_path, big_input, signal_number, exit_code,
                                                                workers):
    process = _start(tmp_path, big_input, *KEYS_AND_FORMATS, "--workers", workers, "--chunk-bytes", "100000")
    _wait_until_staging_holds(tmp_path, process)
    os.killpg(process.pid, signal_number)  # as a terminal's Ctrl-C or a scheduler does: the whole group
    err = _finish(process)
    lines = [line for line in err.decode().splitlines() if line.startswith("preprocess-data")
             or "Traceback" in line or "Error" in line]
    assert lines == [f"preprocess-data: interrupted ({signal.Signals(signal_number).name}); nothing half-written "
                     "was left"], err.decode()
    assert process.returncode == exit_code
    assert _visible(tmp_path) == ["big.jsonl"]


class _FullDisk(io.FileIO):
    """A file on a disk with no space left: every write fails as the kernel's would."""

    def write(self, data) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def _full_disk_open(file, mode="r", buffering=-1, **kwargs):
    """open() for the token writer: its `.bin` temporaries land on a full disk (small buffer, so that
    adding documents already fails, and flushing the rest on clean-up fails again)."""
    if "w" in mode and ".bin." in os.path.basename(str(file)):
        return io.BufferedWriter(_FullDisk(file, "w"), buffer_size=16)
    return builtins.open(file, mode, buffering, **kwargs)


def test_a_full_disk_is_one_line_naming_the_output_and_leaves_no_hidden_temporary(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(indexed_dataset.writer, "open", _full_disk_open, raising=False)
    source = _small_input(tmp_path)
    assert cli.main(_argv(tmp_path, source, "--output-format", "mmap", "arrow")) == 1
    err = capsys.readouterr().err
    assert err == (f"preprocess-data: error: [Errno 28] No space left on device: "
                   f"'{tmp_path / 'out_text_document.bin'}'\n")
    assert _visible(tmp_path) == ["in.jsonl"]


def test_the_token_writer_removes_its_temporary_even_when_closing_fails(tmp_path, monkeypatch):
    monkeypatch.setattr(indexed_dataset.writer, "open", _full_disk_open, raising=False)
    writer = IndexedDatasetWriter(str(tmp_path / "x"), "uint16")
    with pytest.raises(OSError):
        writer.add_documents([1, 2, 3] * 10, [30], [1])
    writer.abort()  # flushing the buffer fails again: the temporary must still go
    assert os.listdir(tmp_path) == []


def test_a_stale_arrow_temporary_does_not_block_a_rerun(tmp_path):
    source = _small_input(tmp_path)
    folder = tmp_path / "out_text_document_arrow"
    folder.mkdir()
    (folder / ".data-00000.arrow.tmp").write_bytes(b"left by a killed run")
    assert cli.main(_argv(tmp_path, source, "--output-format", "arrow")) == 0
    assert sorted(os.listdir(folder)) == ["data-00000-of-00001.arrow", "dataset_info.json", "state.json"]
