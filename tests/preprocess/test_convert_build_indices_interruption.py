"""Ctrl-C and SIGTERM in `convert` and `build-indices`: one line, exit 130 / 143, no traceback, and
nothing half-written left (each command runs in a subprocess that is signalled while it writes)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable

import numpy as np
import pytest

from indexed_dataset import IndexedDatasetWriter
from preprocess_testing import REPO

NUM_DOCUMENTS = 400_000  # small batches of these keep `convert` busy for seconds, even on a fast machine
# Seconds to wait for the command to start writing, then for it to end after the signal.
START_TIMEOUT_S = 120
EXIT_TIMEOUT_S = 60
EXIT_CODES = {signal.SIGINT: 130, signal.SIGTERM: 143}
RUN_CONVERT = "import sys; from preprocess.convert_cli import main; raise SystemExit(main(sys.argv[1:]))"
# build-indices writes each cache array under a temporary name; this makes every write pause while the
# temporary exists, so the signal lands exactly in the window that must leave nothing behind.
RUN_SLOW_BUILD_INDICES = """
import sys, time
import numpy as np
from samplers import cache
def slow_save(path, array):
    def write(f):
        np.save(f, array, allow_pickle=False)
        f.flush()
        time.sleep(600)
    cache.write_atomically(path, write)
cache.save_array = slow_save
from samplers.cli import main
raise SystemExit(main(sys.argv[1:]))
"""


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> str:
    """An mmap dataset of NUM_DOCUMENTS short int32 documents."""
    prefix = str(tmp_path_factory.mktemp("source") / "src")
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 20, NUM_DOCUMENTS)
    with IndexedDatasetWriter(prefix, np.int32) as writer:
        writer.add_documents(rng.integers(0, 50_000, int(lengths.sum())), lengths, np.ones(NUM_DOCUMENTS, np.int64))
    return prefix


def signal_when(code: str, argv: list[str], started: Callable[[], bool], signal_number: int) -> tuple[int, str]:
    """Run `python -c code argv...`, send `signal_number` once `started()` holds; (exit code, stderr)."""
    env = {**os.environ, "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", "")}
    process = subprocess.Popen([sys.executable, "-c", code, *argv], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not started():
            assert process.poll() is None, f"finished before it was signalled: {process.communicate()[1]}"
            assert time.monotonic() < deadline, "never started writing"
            time.sleep(0.01)
        process.send_signal(signal_number)
        _, stderr = process.communicate(timeout=EXIT_TIMEOUT_S)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    return process.returncode, stderr


def assert_one_interruption_line(stderr: str, prog: str, signal_number: int) -> None:
    name = signal.Signals(signal_number).name
    assert "Traceback" not in stderr
    ours = [line for line in stderr.splitlines() if line.startswith(f"{prog}:")]
    assert ours == [f"{prog}: interrupted ({name}); nothing half-written was left"]


@pytest.mark.parametrize(
    "target, extra, signal_number",
    [("mmap", [], signal.SIGINT), ("mindrecord", ["--mindrecord-shards", "4"], signal.SIGTERM)],
)
def test_convert_interrupted_leaves_nothing(source, tmp_path, target, extra, signal_number):
    out = tmp_path / "out"
    out.mkdir()
    name = "x.mindrecord" if target == "mindrecord" else "x"
    argv = ["--from", "mmap", "--to", target, source, str(out / name), "--batch-documents", "4", *extra]
    code, stderr = signal_when(RUN_CONVERT, argv, lambda: bool(os.listdir(out)), signal_number)
    assert code == EXIT_CODES[signal_number]
    assert_one_interruption_line(stderr, "convert", signal_number)
    assert os.listdir(out) == []


@pytest.mark.parametrize("signal_number", [signal.SIGTERM, signal.SIGINT])
def test_build_indices_interrupted_leaves_no_partial_cache_file(source, tmp_path, signal_number):
    cache = tmp_path / "cache"
    argv = ["--data-path", source, "--seq-length", "8", "--data-cache-path", str(cache)]

    def writing() -> bool:
        return cache.is_dir() and any(".tmp-" in name for name in os.listdir(cache))

    code, stderr = signal_when(RUN_SLOW_BUILD_INDICES, argv, writing, signal_number)
    assert code == EXIT_CODES[signal_number]
    assert_one_interruption_line(stderr, "build-indices", signal_number)
    left = os.listdir(cache)
    assert not any(".tmp-" in name or name.endswith(".done") for name in left), left
