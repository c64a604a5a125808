"""Ctrl-C and SIGTERM in ``train``: one line, exit 130 / 143, no traceback (neither Python's
KeyboardInterrupt nor torch's SignalException), in one process and through the launcher of several.

Each run is a subprocess that trains until it is signalled after its first logged iteration.
"""

from __future__ import annotations

import signal

import pytest
from long_runs_testing import EXIT_TIMEOUT_S, START_TIMEOUT_S, signalled_train
from trainer_testing import argv_for, tiny_config

EXIT_CODES = {signal.SIGINT: 130, signal.SIGTERM: 143}
LONG_RUN_ITERS = 100_000


@pytest.mark.timeout(START_TIMEOUT_S + 2 * EXIT_TIMEOUT_S)
@pytest.mark.parametrize(("processes", "signal_number", "whole_group"), [
    (1, signal.SIGINT, True),    # Ctrl-C in a terminal
    pytest.param(1, signal.SIGTERM, False, marks=pytest.mark.campaign),  # kill, a scheduler's preemption
    pytest.param(2, signal.SIGINT, True, marks=pytest.mark.campaign),  # Ctrl-C reaches launcher and workers at once
    (2, signal.SIGTERM, False),  # SIGTERM to the launcher only: it stops its workers
])
def test_a_signal_ends_train_with_one_line(processes, signal_number, whole_group, tiny_prefix, cache_dir, tmp_path):
    config = tiny_config(tiny_prefix, cache_dir, train_iters=LONG_RUN_ITERS, save=str(tmp_path / "run"),
                         num_layers=2)
    argv = [*argv_for(config), "--log-interval", "1", "--nproc-per-node", str(processes)]
    code, lines = signalled_train(argv, signal_number, whole_group)
    name = signal.Signals(signal_number).name
    output = "\n".join(lines)  # in full: a traceback may come from any process, at any point
    assert code == EXIT_CODES[signal_number], output
    assert not any("Traceback" in line or "SignalException" in line for line in lines), output
    assert lines[-1] == f"train: interrupted ({name}); nothing half-written was left", output
    # No half-written checkpoint: either none yet, or only complete ones.
    assert not list((tmp_path / "run").glob("*.tmp")) if (tmp_path / "run").exists() else True
