"""``train --max-restarts N``: when a rank dies (SIGKILL at a random step), every rank stops, the workers
start again and resume from the latest complete checkpoint with the same data order: the run reaches
--train-iters, its losses equal an uninterrupted run's bit for bit (CPU), and metrics.jsonl has each iteration
once; for a DP 2 run and (with `pytest -m campaign`: four processes take minutes on a busy machine) a TP 2 x
PP 2 one. A rank that keeps dying uses up the N restarts, and the run ends non-zero with one line naming the rank
and the cause.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from long_runs_testing import EXIT_TIMEOUT_S, REPO, START_TIMEOUT_S, worker_ranks
from trainer_testing import argv_for, tiny_config

from trainer.metrics.records import METRICS_FILE_NAME

TRAIN_ITERS = 10
SAVE_INTERVAL = 2
PROCESSES = 2
# Layouts of the killed-rank run: (processes, `tiny_config` parallel sizes).
LAYOUTS = {"dp2": (PROCESSES, {}), "tp2_pp2": (4, {"tp": 2, "pp": 2})}
STEP_LINE = re.compile(r"^ iteration +(\d+)/")
# Seconds between two looks for the workers of a (re)started launch.
POLL_S = 0.1


class _Run:
    """``train argv`` in a subprocess whose stderr lines are collected; `kill_at` SIGKILLs a worker."""

    def __init__(self, argv: list[str], processes: int = PROCESSES) -> None:
        self.processes = processes
        self.process = subprocess.Popen([sys.executable, "-m", "trainer.cli.train", *argv], cwd=REPO,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                        start_new_session=True)
        self.lines: list[str] = []
        self.steps_logged = 0
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.process.stderr:
            self.lines.append(line.rstrip("\n"))
            if STEP_LINE.match(line):
                self.steps_logged += 1

    def kill_worker_after(self, steps_logged: int, rank: int, earlier: frozenset[int] = frozenset()) -> frozenset[int]:
        """SIGKILL worker ``rank`` once this many step lines have been logged (over all attempts) and the
        launcher runs a full set of workers none of which is among ``earlier`` (an earlier attempt's pids).

        Returns:
            The pids of the attempt whose worker was killed.
        """
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            assert time.monotonic() < deadline and self.process.poll() is None, "\n".join(self.lines[-30:])
            workers = worker_ranks(self.process.pid)
            full = len(workers) == self.processes
            if self.steps_logged >= steps_logged and full and not earlier & set(workers.values()):
                os.kill(workers[rank], signal.SIGKILL)
                return frozenset(workers.values())
            time.sleep(POLL_S)

    def finish(self) -> int:
        try:
            return self.process.wait(START_TIMEOUT_S + EXIT_TIMEOUT_S)
        finally:
            if self.process.poll() is None:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
            self._reader.join(EXIT_TIMEOUT_S)


def _losses(save: Path) -> list[tuple[int, float]]:
    records = [json.loads(line) for line in (save / METRICS_FILE_NAME).read_text().splitlines()]
    return [(record["iteration"], record["loss"]) for record in records if "split" not in record and "loss" in record]


def _argv(tiny_prefix: str, cache_dir: str, save: Path, *extra: str, processes: int = PROCESSES,
          **layout: int) -> list[str]:
    config = tiny_config(tiny_prefix, cache_dir, save=str(save), save_interval=SAVE_INTERVAL, train_iters=TRAIN_ITERS,
                         num_layers=2, **layout)
    return [*argv_for(config), "--metrics-file", str(save / METRICS_FILE_NAME), "--log-interval", "1",
            "--nproc-per-node", str(processes), "--master-port", "0", *extra]


@pytest.mark.timeout(3 * (START_TIMEOUT_S + EXIT_TIMEOUT_S))
@pytest.mark.parametrize("layout", ["dp2", pytest.param("tp2_pp2", marks=pytest.mark.campaign)])
def test_a_killed_rank_restarts_the_run_which_ends_as_an_uninterrupted_one(layout, tiny_prefix, cache_dir, tmp_path):
    processes, sizes = LAYOUTS[layout]
    straight = _Run(_argv(tiny_prefix, cache_dir, tmp_path / "straight", processes=processes, **sizes), processes)
    assert straight.finish() == 0, straight.lines[-20:]
    save = tmp_path / "restarted"
    run = _Run(_argv(tiny_prefix, cache_dir, save, "--max-restarts", "1", processes=processes, **sizes), processes)
    killed_after = random.randint(SAVE_INTERVAL + 1, TRAIN_ITERS - 2)
    run.kill_worker_after(killed_after, rank=random.randint(0, processes - 1))
    assert run.finish() == 0, run.lines[-20:]
    assert not any("Traceback" in line for line in run.lines), run.lines[-20:]
    assert any("resuming from the latest complete checkpoint" in line for line in run.lines), run.lines[-30:]
    losses = _losses(save)
    assert [iteration for iteration, _ in losses] == list(range(1, TRAIN_ITERS + 1)), (killed_after, losses)
    assert losses == _losses(tmp_path / "straight"), killed_after


@pytest.mark.timeout(3 * (START_TIMEOUT_S + EXIT_TIMEOUT_S))
def test_a_rank_that_keeps_dying_uses_up_the_restarts(tiny_prefix, cache_dir, tmp_path):
    run = _Run(_argv(tiny_prefix, cache_dir, tmp_path / "run", "--max-restarts", "1"))
    first_attempt = run.kill_worker_after(1, rank=1)
    run.kill_worker_after(run.steps_logged + 1, rank=1, earlier=first_attempt)  # the restarted attempt's rank 1
    assert run.finish() != 0
    errors = [line for line in run.lines if line.startswith("train: error:")]
    assert errors == ["train: error: worker rank 1 was killed by SIGKILL; see its output above (after 1 restart, "
                      "--max-restarts)"], run.lines[-20:]
    assert not any("Traceback" in line for line in run.lines), run.lines[-20:]

