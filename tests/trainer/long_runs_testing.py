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
# Seconds for a process that did not end to print its stacks on SIGABRT.
ABORT_TIMEOUT_S = 10
# A log line of a training step (`trainer.metrics.writers.TrainStats.log_line`).
STEP_LINE_MARKS = ("iteration", "consumed samples")


def signalled_train(argv: list[str], signal_number: int, whole_group: bool = False) -> tuple[int, list[str]]:
    """Run ``train argv`` in a subprocess and send ``signal_number`` once it logs a step: to its launcher only, or,
    with ``whole_group``, to every process of its group as a terminal's Ctrl-C does; (exit code, stderr lines).

    The process runs with ``-X faulthandler``: one that does not end within EXIT_TIMEOUT_S of the signal is sent
    SIGABRT, prints every thread's stack, and the call fails with them; the group is killed if it outlives that.
    """
    process = subprocess.Popen([sys.executable, "-X", "faulthandler", "-m", "trainer.cli.train", *argv], cwd=REPO,
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
        if whole_group:
            os.killpg(process.pid, signal_number)
        else:
            process.send_signal(signal_number)
        try:
            code = process.wait(EXIT_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGABRT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(ABORT_TIMEOUT_S)
            reader.join(ABORT_TIMEOUT_S)
            raise AssertionError(f"train did not end within {EXIT_TIMEOUT_S} s of the signal; its stacks:\n"
                                 + "\n".join(lines[-60:])) from None
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
