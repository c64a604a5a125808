"""Ctrl-C and SIGTERM in ``train``: one line, exit 130 / 143, no traceback (neither Python's
KeyboardInterrupt nor torch's SignalException), in one process and through the launcher of several.

Each run is a subprocess that trains until it is signalled after its first logged iteration.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from trainer_testing import argv_for, tiny_config

REPO = Path(__file__).resolve().parents[2]
# Seconds to wait for the first logged iteration, then for the process to end after the signal.
START_TIMEOUT_S = 180
EXIT_TIMEOUT_S = 90
# Seconds for a process that did not end to print its stacks on SIGABRT.
ABORT_TIMEOUT_S = 10
EXIT_CODES = {signal.SIGINT: 130, signal.SIGTERM: 143}
LONG_RUN_ITERS = 100_000


def _signalled_run(argv: list[str], signal_number: int, whole_group: bool) -> tuple[int, list[str]]:
    """Start ``train argv``, send ``signal_number`` once it logs an iteration (to every process of its group,
    as a terminal's Ctrl-C does, with ``whole_group``); (exit code, stderr lines)."""
    # -X faulthandler: a process that does not end is sent SIGABRT, and prints every thread's stack first.
    process = subprocess.Popen([sys.executable, "-X", "faulthandler", "-m", "trainer.cli.train", *argv], cwd=REPO,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    lines: list[str] = []
    started = threading.Event()

    def read() -> None:
        for line in process.stderr:
            lines.append(line.rstrip("\n"))
            if "iteration" in line and "consumed samples" in line:
                started.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert started.wait(START_TIMEOUT_S), "\n".join(lines[-20:])
        if whole_group:
            os.killpg(process.pid, signal_number)
        else:
            process.send_signal(signal_number)
        try:
            code = process.wait(EXIT_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGABRT)
            process.wait(ABORT_TIMEOUT_S)
            reader.join(ABORT_TIMEOUT_S)
            pytest.fail(f"train did not end within {EXIT_TIMEOUT_S} s of the signal; its stacks:\n" + "\n".join(lines[-60:]))
    finally:
        process.kill()
    reader.join(EXIT_TIMEOUT_S)
    return code, lines


@pytest.mark.timeout(START_TIMEOUT_S + 2 * EXIT_TIMEOUT_S)
@pytest.mark.parametrize(("processes", "signal_number", "whole_group"), [
    (1, signal.SIGINT, True),    # Ctrl-C in a terminal
    (1, signal.SIGTERM, False),  # kill, a scheduler's preemption
    (2, signal.SIGINT, True),    # Ctrl-C reaches the launcher and its workers at once
    (2, signal.SIGTERM, False),  # SIGTERM to the launcher only: it stops its workers
])
def test_a_signal_ends_train_with_one_line(processes, signal_number, whole_group, tiny_prefix, cache_dir, tmp_path):
    config = tiny_config(tiny_prefix, cache_dir, train_iters=LONG_RUN_ITERS, save=str(tmp_path / "run"),
                         num_layers=2)
    argv = [*argv_for(config), "--log-interval", "1", "--nproc-per-node", str(processes)]
    code, lines = _signalled_run(argv, signal_number, whole_group)
    name = signal.Signals(signal_number).name
    assert code == EXIT_CODES[signal_number], lines[-20:]
    assert not any("Traceback" in line or "SignalException" in line for line in lines), lines[-20:]
    assert lines[-1] == f"train: interrupted ({name}); nothing half-written was left", lines[-20:]
    # No half-written checkpoint: either none yet, or only complete ones.
    assert not list((tmp_path / "run").glob("*.tmp")) if (tmp_path / "run").exists() else True
