"""Helpers of the long-run tests (imported by the processes they spawn): a ``train`` subprocess that is
signalled once it has logged an iteration, and a launcher entry point that waits for a signal."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# Seconds to wait for the first logged iteration, then for the process to end after the signal.
START_TIMEOUT_S = 180
EXIT_TIMEOUT_S = 120
# A log line of a training step (`trainer.metrics.writers.TrainStats.log_line`).
STEP_LINE_MARKS = ("iteration", "consumed samples")


def signalled_train(argv: list[str], signal_number: int) -> tuple[int, list[str]]:
    """Run ``train argv`` in a subprocess, send ``signal_number`` to it (its launcher only, not its workers) once
    it logs a step; (exit code, stderr lines). The process is killed if it outlives EXIT_TIMEOUT_S."""
    process = subprocess.Popen([sys.executable, "-m", "trainer.cli.train", *argv], cwd=REPO,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    lines: list[str] = []
    started = threading.Event()

    def read() -> None:
        for line in process.stderr:
            lines.append(line.rstrip("\n"))
            if all(mark in line for mark in STEP_LINE_MARKS):
                started.set()
        started.set()  # the process ended before a step: the check below reports it

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        if not started.wait(START_TIMEOUT_S) or process.poll() is not None:
            raise AssertionError("no step logged:\n" + "\n".join(lines[-20:]))
        process.send_signal(signal_number)
        code = process.wait(EXIT_TIMEOUT_S)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    reader.join(EXIT_TIMEOUT_S)
    return code, lines


def wait_for_signal(ready_dir: str, signal_name: str, wait_s: float) -> int:
    """A launcher's worker: says it is ready (a file named for its rank), then returns 0 if ``signal_name``
    reaches it within ``wait_s`` seconds (else 1)."""
    received = threading.Event()
    signal.signal(signal.Signals[signal_name], lambda number, frame: received.set())
    Path(ready_dir, os.environ["RANK"]).touch()
    if not received.wait(wait_s):
        raise SystemExit(1)
    return 0


def worker_ranks(launcher_pid: int) -> dict[int, int]:
    """Rank -> pid of the worker processes a single-node ``train`` launcher started: its multiprocessing
    children (read from /proc), started in the order of their ranks (torch's ``start_processes``; a worker
    sets its RANK variable only after it started, so /proc/PID/environ does not show it)."""
    children: set[int] = set()
    for task in Path(f"/proc/{launcher_pid}/task").iterdir():
        with contextlib.suppress(OSError):
            children.update(int(pid) for pid in (task / "children").read_text().split())
    workers = []
    for pid in children:
        with contextlib.suppress(OSError):  # it ended meanwhile
            if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes():
                workers.append(pid)
    return dict(enumerate(sorted(workers)))
