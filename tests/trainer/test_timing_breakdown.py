"""``--timing-log-level 1`` (DeepSpeed's ``wall_clock_breakdown``): every log interval, the milliseconds per step
spent in forward+backward, gradient norm and clipping, and the optimiser step (and the data wait) are in the log
line and in metrics.jsonl; at level 0 neither the keys nor the labels appear and nothing is synchronised."""

import dataclasses
import logging

import pytest
import torch
from trainer_testing import tiny_config

from trainer.config import LoggingConfig
from trainer.errors import TrainConfigError
from trainer.metrics.writers import PHASE_KEY_SUFFIX, TIMING_PHASES, StepTimer
from trainer.metrics.records import read_run
from trainer.train import train

STEPS = 4
LOG_INTERVAL = 2
PHASE_KEYS = [phase + PHASE_KEY_SUFFIX for phase in TIMING_PHASES]
# Phases are timed inside the step that ms_per_iteration times; perf_counter readings differ by nanoseconds.
CLOCK_SLACK_MS = 1e-3


def timed_run(tiny_prefix, cache_dir, tmp_path, level: int, caplog):
    config = tiny_config(tiny_prefix, cache_dir, train_iters=STEPS, num_layers=2, hidden_size=16,
                         metrics_file=str(tmp_path / "metrics.jsonl"))
    config = dataclasses.replace(config, logging=dataclasses.replace(config.logging, log_interval=LOG_INTERVAL,
                                                                     timing_log_level=level))
    with caplog.at_level(logging.INFO, logger="trainer.metrics.writers"):
        train(config)
    lines = [record.getMessage() for record in caplog.records if "iteration" in record.getMessage()
             and "lm loss:" in record.getMessage()]
    return read_run(tmp_path / "metrics.jsonl").train, lines


@pytest.mark.timeout(300)
def test_level_1_times_each_phase_per_log_interval_in_the_log_line_and_metrics(tiny_prefix, cache_dir, tmp_path,
                                                                               caplog):
    records, lines = timed_run(tiny_prefix, cache_dir, tmp_path, 1, caplog)
    assert [record["iteration"] for record in records] == [2, 4] and len(lines) == 2
    for record in records:
        phases = [record[key] for key in PHASE_KEYS]
        assert all(ms >= 0 for ms in phases) and record[PHASE_KEYS[0]] > 0  # a forward+backward takes time
        assert sum(phases) + record["data_ms_per_iteration"] <= record["ms_per_iteration"] + CLOCK_SLACK_MS
    for line in lines:
        for label in ("data (ms):", *(f"{label} (ms):" for label in TIMING_PHASES.values())):
            assert label in line, line


@pytest.mark.timeout(300)
def test_level_0_leaves_the_breakdown_out(tiny_prefix, cache_dir, tmp_path, caplog):
    records, lines = timed_run(tiny_prefix, cache_dir, tmp_path, 0, caplog)
    assert records and not any(key in record for record in records for key in PHASE_KEYS)
    assert lines and not any("forward-backward (ms)" in line for line in lines)


def test_step_timer_sums_each_phase_until_taken_and_restarts():
    timer = StepTimer(enabled=True, device=torch.device("cpu"))
    for _ in range(2):
        with timer.phase("optimizer"):
            sum(range(10_000))
    timing = timer.take(steps=2)
    assert set(timing) == set(PHASE_KEYS)
    assert timing["optimizer" + PHASE_KEY_SUFFIX] > 0 and timing["grad_clip" + PHASE_KEY_SUFFIX] == 0
    assert timer.take(steps=1)["optimizer" + PHASE_KEY_SUFFIX] == 0


def test_a_disabled_step_timer_reports_nothing():
    timer = StepTimer(enabled=False, device=torch.device("cpu"))
    with timer.phase("forward_backward"):
        pass
    assert timer.take(steps=1) == {}


def test_a_level_above_megatrons_2_is_refused_with_one_line():
    with pytest.raises(TrainConfigError) as error:
        LoggingConfig(timing_log_level=3)
    assert str(error.value) == "`timing_log_level` must be in [0, 2], got 3"
