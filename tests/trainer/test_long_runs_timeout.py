"""``train --distributed-timeout-minutes M`` (Megatron's flag; fractions accepted): a collective that waits longer
than M for a stalled rank (here: a worker stopped with SIGSTOP) ends the run non-zero with one line naming the
timeout, the rank that waited, the last completed iteration and the rank that did not arrive (with its own last
completed iteration), without a traceback; with ``--max-restarts`` the
workers start again and the run reaches --train-iters. Zero or a negative timeout is refused in one line.
"""

from __future__ import annotations

import contextlib
import os
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

from trainer.cli.train import main
from trainer.errors import CollectiveTimeoutError
from trainer.parallel.collective_timeout import reported_timeouts

PROCESSES = 2
# 6 s: long enough for the ranks' start-up collectives on a busy machine, short enough for a test.
TIMEOUT_MINUTES = 0.1
STALLED_RANK = 1
STEP_LINE = re.compile(r"^ iteration +(\d+)/")
POLL_S = 0.1
# The timeout, then the launcher stopping the workers (it wakes the stalled one first, so that the SIGTERM ends
# it at once instead of torch's SIGKILL after a 30 s grace), with room for a busy machine.
FAILURE_BOUND_S = 60 * TIMEOUT_MINUTES + EXIT_TIMEOUT_S


class _StalledRun:
    """``train argv`` in a subprocess; `stall_after` stops one worker with SIGSTOP, as a hung GPU or a swapped-out
    host would leave it: alive, but never at the next collective."""

    def __init__(self, argv: list[str]) -> None:
        self.process = subprocess.Popen([sys.executable, "-m", "trainer.cli.train", *argv], cwd=REPO,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                        start_new_session=True)
        self.lines: list[str] = []
        self.steps_logged = 0
        self.last_iteration = 0
        self.stalled: int | None = None
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.process.stderr:
            self.lines.append(line.rstrip("\n"))
            step = STEP_LINE.match(line)
            if step:
                self.steps_logged += 1
                self.last_iteration = int(step[1])

    def stall_after(self, steps_logged: int) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            assert time.monotonic() < deadline and self.process.poll() is None, "\n".join(self.lines[-30:])
            workers = worker_ranks(self.process.pid)
            if self.steps_logged >= steps_logged and len(workers) == PROCESSES:
                self.stalled = workers[STALLED_RANK]
                os.kill(self.stalled, signal.SIGSTOP)
                return
            time.sleep(POLL_S)

    def finish(self, bound_s: float) -> tuple[int, float]:
        """(exit code, seconds it took after the stall); the process group is killed if it outlives ``bound_s``."""
        started = time.monotonic()
        try:
            code = self.process.wait(bound_s)
            return code, time.monotonic() - started
        finally:
            if self.process.poll() is None:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
            if self.stalled is not None:
                with contextlib.suppress(ProcessLookupError):  # gone, as it should be
                    os.kill(self.stalled, signal.SIGKILL)
            self._reader.join(EXIT_TIMEOUT_S)


def _argv(tiny_prefix: str, cache_dir: str, save: Path, train_iters: int, *extra: str) -> list[str]:
    config = tiny_config(tiny_prefix, cache_dir, save=str(save), save_interval=2, train_iters=train_iters,
                         num_layers=2)
    return [*argv_for(config), "--log-interval", "1", "--nproc-per-node", str(PROCESSES), "--master-port", "0",
            "--distributed-timeout-minutes", str(TIMEOUT_MINUTES), *extra]


@pytest.mark.timeout(START_TIMEOUT_S + FAILURE_BOUND_S + EXIT_TIMEOUT_S)
def test_a_stalled_rank_ends_the_run_with_one_line(tiny_prefix, cache_dir, tmp_path):
    run = _StalledRun(_argv(tiny_prefix, cache_dir, tmp_path / "run", 1000))
    run.stall_after(2)
    code, seconds = run.finish(FAILURE_BOUND_S)
    assert code != 0 and seconds < FAILURE_BOUND_S, (code, seconds, run.lines[-20:])
    errors = [line for line in run.lines if line.startswith("train: error:")]
    assert len(errors) == 1, run.lines[-20:]
    assert "--distributed-timeout-minutes" in errors[0] and re.search(r"\brank \d\b", errors[0]), errors
    assert re.search(r"last completed iteration is \d+", errors[0]), errors
    # Stopped in a step or in the save that follows every second one.
    named = re.search(rf"\brank {STALLED_RANK} did not arrive: it has not run for [\d.]+ s \(stopped, hung or dead\), "
                      r"it is in the \w+ (of|after) iteration \d+ and its last completed iteration is \d+", errors[0])
    assert named, errors
    assert not any("Traceback" in line or "terminate called" in line for line in run.lines), run.lines[-30:]


@pytest.mark.timeout(2 * START_TIMEOUT_S + FAILURE_BOUND_S + EXIT_TIMEOUT_S)
def test_with_max_restarts_the_run_restarts_after_a_timeout(tiny_prefix, cache_dir, tmp_path):
    train_iters = 6
    run = _StalledRun(_argv(tiny_prefix, cache_dir, tmp_path / "run", train_iters, "--max-restarts", "1"))
    run.stall_after(3)
    code, _ = run.finish(START_TIMEOUT_S + FAILURE_BOUND_S)
    assert code == 0, run.lines[-30:]
    assert any("resuming from the latest complete checkpoint" in line for line in run.lines), run.lines[-30:]
    assert run.last_iteration == train_iters, run.lines[-30:]


@pytest.mark.parametrize("minutes", ["0", "-1"])
def test_a_timeout_that_is_not_positive_is_one_line(minutes, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    before = sorted(tmp_path.iterdir())
    code = main(["--dataset", "data/none", "--distributed-timeout-minutes", minutes])
    assert code != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("train: error:") and "--distributed-timeout-minutes" in err[0], err
    assert "Traceback" not in err[0]
    assert sorted(tmp_path.iterdir()) == before


def test_only_a_collective_timeout_becomes_the_timeout_line():
    with pytest.raises(CollectiveTimeoutError, match=r"rank 3 .* waiting for a recv .* last completed iteration is 7"):
        with reported_timeouts(TIMEOUT_MINUTES, 3, lambda: 7):
            raise RuntimeError("[gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 6000ms for recv "
                               "operation to complete")
    with pytest.raises(RuntimeError, match="^Connection closed by peer$"):  # not a timeout: passed on as it is
        with reported_timeouts(TIMEOUT_MINUTES, 3, lambda: 7):
            raise RuntimeError("Connection closed by peer")
