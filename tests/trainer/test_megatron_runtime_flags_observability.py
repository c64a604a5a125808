"""Megatron's observability flags (`trainer.metrics.step_observer`, `trainer.metrics.writers`).

Promised:
- ``--profile --profile-step-start S --profile-step-end E`` writes a torch.profiler Chrome trace of steps S..E-1
  (one ``ProfilerStep#<iteration>`` range each, no other step) to ``<save>/torch_profile/rank-0.json.gz``, on
  the ranks ``--profile-ranks`` names only; a profile with nowhere to go is one line;
- ``--record-memory-history`` on a CPU is one line (it records the CUDA allocator);
- ``--manual-gc`` turns the collector off for the run and collects at the start and every
  ``--manual-gc-interval`` steps; the collector is back on afterwards;
- ``--logging-level 30`` leaves out rank 0's INFO lines;
- ``--wandb-project`` sends the metrics to Weights & Biases (tested offline: the run's file holds them), and
  without the wandb package it is one line saying ``pip install wandb``;
- on CUDA (skipped elsewhere): ``--record-memory-history`` writes ``PATH_<rank>`` snapshots, and a bf16 run
  with ``--attention-backend flash`` trains.
"""

from __future__ import annotations

import dataclasses
import gc
import gzip
import importlib.util
import json
import logging
import math
import time

import pytest
import torch

from trainer.config import KernelConfig, ObservabilityConfig
from trainer.metrics.step_observer import StepObserver, trace_path
from trainer_testing import argv_for, result_record, tiny_config, train_in_process

STEPS = 5
# Seconds wandb's service may take to write an offline run's file after the run finished, and the poll period.
WANDB_FLUSH_S, POLL_S = 60, 0.2


def profiled_steps(trace: str) -> set[int]:
    with gzip.open(trace, "rt", encoding="utf-8") as file:
        events = json.load(file)["traceEvents"]
    return {int(event["name"].split("#")[1]) for event in events if event.get("name", "").startswith("ProfilerStep#")}


def test_profile_traces_exactly_the_asked_steps_on_the_asked_ranks(tiny_prefix, cache_dir, tmp_path):
    config = tiny_config(tiny_prefix, cache_dir, train_iters=STEPS, save=str(tmp_path / "run"))
    config.observability = ObservabilityConfig(profile=True, profile_step_start=2, profile_step_end=4)
    result_record(config)
    trace = trace_path(tmp_path / "run", 0)
    assert trace.is_file() and not list(trace.parent.glob(".*tmp*"))
    assert profiled_steps(str(trace)) == {2, 3}
    elsewhere = tiny_config(tiny_prefix, cache_dir, train_iters=2, save=str(tmp_path / "other"))
    elsewhere.observability = ObservabilityConfig(profile=True, profile_step_start=1, profile_step_end=2,
                                                  profile_ranks=[1])
    result_record(elsewhere)
    assert not (tmp_path / "other" / "torch_profile").exists()


@pytest.mark.parametrize(("flags", "named"), [
    (["--profile"], "--profile needs --tensorboard-dir or --save"),
    (["--profile", "--save", "SAVE", "--profile-step-start", "3", "--profile-step-end", "3"],
     "--profile-step-end (3) must be after --profile-step-start (3)"),
    (["--manual-gc-interval", "5"], "--manual-gc-interval needs --manual-gc"),
    (["--wandb-exp-name", "x"], "--wandb-exp-name need --wandb-project"),
    (["--logging-level", "60"], "--logging-level"),
])
def test_inconsistent_flags_are_one_line(flags, named, tmp_path, capsys):
    flags = [str(tmp_path / "save") if word == "SAVE" else word for word in flags]
    code, lines = train_in_process(["--dataset", str(tmp_path / "missing"), "--device", "cpu", *flags], capsys)
    assert code != 0
    assert len(lines) == 1 and named in lines[0], lines
    assert list(tmp_path.iterdir()) == []


def test_record_memory_history_on_a_cpu_is_one_line(tiny_prefix, cache_dir, tmp_path, capsys):
    argv = argv_for(tiny_config(tiny_prefix, cache_dir, train_iters=1)) + ["--record-memory-history"]
    code, lines = train_in_process(argv, capsys)
    assert code != 0 and len(lines) == 1, lines
    assert "--record-memory-history records the CUDA allocator's history; this run computes on cpu" in lines[0]


def test_manual_gc_collects_at_the_start_and_every_interval(monkeypatch, reference, tiny_prefix, cache_dir):
    collections: list[int] = []
    monkeypatch.setattr(gc, "collect", lambda generation=2: collections.append(generation) or 0)
    settings = ObservabilityConfig(manual_gc=True, manual_gc_interval=2)
    assert gc.isenabled()
    with StepObserver(settings, None, 0, torch.device("cpu"), log_interval=1) as observer:
        assert not gc.isenabled() and len(collections) == 1
        for iteration in range(1, 6):
            with observer.step(iteration):
                pass
        assert len(collections) == 3  # the start, after steps 2 and 4
    assert gc.isenabled()
    config = tiny_config(tiny_prefix, cache_dir, train_iters=3)
    config.observability = ObservabilityConfig(manual_gc=True, manual_gc_interval=1)
    assert result_record(config)["losses"] == reference["losses"][:3]
    assert gc.isenabled()


def test_logging_level_leaves_out_info_lines(tiny_prefix, cache_dir, capsys, caplog):
    argv = argv_for(tiny_config(tiny_prefix, cache_dir, train_iters=1))
    root = logging.getLogger()
    level = root.level
    try:
        assert train_in_process(argv + ["--logging-level", "30"], capsys)[0] == 0
        assert "iteration" not in caplog.text
        caplog.clear()
        root.setLevel(logging.INFO)
        assert train_in_process(argv + ["--logging-level", "20"], capsys)[0] == 0
        assert " iteration        1/       1" in caplog.text
    finally:
        root.setLevel(level)


@pytest.mark.skipif(importlib.util.find_spec("wandb") is None, reason="wandb is an optional extra")
def test_wandb_offline_run_holds_the_metrics(tiny_prefix, cache_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    config = tiny_config(tiny_prefix, cache_dir, train_iters=2)
    config.logging = dataclasses.replace(config.logging, log_interval=1)
    config.observability = ObservabilityConfig(wandb_project="tokenmill-test", wandb_exp_name="tiny",
                                               wandb_save_dir=str(tmp_path / "wandb"))
    losses = result_record(config)["losses"]
    [run_file] = (tmp_path / "wandb").glob("wandb/offline-run-*/run-*.wandb")
    # wandb's own service process writes the file, and may still be writing it after the run finished
    deadline = time.monotonic() + WANDB_FLUSH_S
    while b"train/loss" not in run_file.read_bytes() and time.monotonic() < deadline:
        time.sleep(POLL_S)
    data = run_file.read_bytes()
    assert b"tokenmill-test" in data and b"tiny" in data
    assert b"train/loss" in data
    assert all(json.dumps(loss).encode() in data for loss in losses)


def test_wandb_without_the_package_is_one_line(monkeypatch, tmp_path, capsys):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    code, lines = train_in_process(["--dataset", str(tmp_path / "missing"), "--wandb-project", "p"], capsys)
    assert code != 0 and lines == ["train: error: --wandb-project needs the wandb package: pip install wandb"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_memory_history_dumps_snapshots_and_flash_attention_trains(tiny_prefix, cache_dir, tmp_path):
    config = tiny_config(tiny_prefix, cache_dir, train_iters=2)
    config.training = dataclasses.replace(config.training, device="cuda")
    config.precision = dataclasses.replace(config.precision, bf16=True)
    config.logging = dataclasses.replace(config.logging, log_interval=1)
    config.kernels = KernelConfig(attention_backend="flash")
    config.observability = ObservabilityConfig(record_memory_history=True,
                                               memory_snapshot_path=str(tmp_path / "snapshot.pickle"))
    assert all(math.isfinite(loss) for loss in result_record(config)["losses"])
    assert (tmp_path / "snapshot_0.pickle").stat().st_size > 0
