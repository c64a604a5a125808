"""Megatron's batch-size ramps in ``train`` (issue 29, section 1): ``--rampup-batch-size START INCR SAMPLES`` and
``--step-batch-size-schedule "THRESHOLD:BS ..."`` change each step's global batch as megatron-core's calculators
do, and the learning rate counts the samples each step takes: every step's ``lr`` and ``global_batch_size`` in
metrics.jsonl equal the golden arrays (data_test/trainer/megatron_schedules.npz, made by
make_megatron_schedule_golden.py), also across a resume in the middle of the ramp. The samples stay in the
global order (a ramped run reads the same samples as a constant one, in other step boundaries). What cannot
apply is one line naming the flag.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
from test_megatron_schedule_golden import CASES, DEFAULTS, GOLDEN, RELATIVE_TOLERANCE
from trainer_testing import argv_for, tiny_config

from trainer.checkpoint.store import LATEST_FILE
from trainer.cli.train import main
from trainer.config import OptimizerConfig, TrainingConfig
from trainer.data.batches import step_iterator
from trainer.optim.batch_size_schedule import RampupBatchSize

OPTIMIZER_FIELDS = frozenset(OptimizerConfig.__dataclass_fields__)
RAMP_CASES = ["rampup_batch_size", "step_batch_size_schedule"]


def ramp_argv(name: str, prefix: str, cache: str, metrics: Path, **checkpoint) -> list[str]:
    """The ``train`` command line of golden case ``name``: its Megatron flags on one data-parallel rank."""
    args = {**DEFAULTS, **CASES[name]["flags"]}
    assert args["data_parallel_size"] == 1
    config = tiny_config(prefix, cache, num_layers=1, hidden_size=16, metrics_file=str(metrics), **checkpoint)
    config.model.seq_length = args["seq_length"]  # the step schedule's thresholds are tokens of it
    training = TrainingConfig(micro_batch_size=args["micro_batch_size"], global_batch_size=args["global_batch_size"],
                              train_samples=args["train_samples"], device="cpu",
                              rampup_batch_size=args["rampup_batch_size"],
                              step_batch_size_schedule=args["step_batch_size_schedule"])
    optimizer = OptimizerConfig(clip_grad=0.5, **{key: value for key, value in args.items()
                                                  if key in OPTIMIZER_FIELDS and value is not None})
    config = dataclasses.replace(config, training=training, optimizer=optimizer,
                                 logging=dataclasses.replace(config.logging, log_interval=1))
    return argv_for(config)


def logged(metrics: Path, key: str) -> list[float]:
    return [record[key] for record in map(json.loads, metrics.read_text().splitlines()) if key in record]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", RAMP_CASES)
def test_each_step_takes_megatrons_batch_at_megatrons_rate(name, tiny_prefix, cache_dir, tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    assert main(ramp_argv(name, tiny_prefix, cache_dir, metrics)) == 0
    assert logged(metrics, "global_batch_size") == GOLDEN[f"{name}.global_batch_size"].tolist()
    np.testing.assert_allclose(logged(metrics, "lr"), GOLDEN[f"{name}.lr"], rtol=RELATIVE_TOLERANCE, atol=0)
    consumed = np.cumsum(GOLDEN[f"{name}.global_batch_size"])
    assert logged(metrics, "consumed_samples") == consumed.tolist()


@pytest.mark.timeout(300)
def test_a_run_resumed_in_the_ramp_continues_it(tiny_prefix, cache_dir, tmp_path):
    name = "resume_in_rampup"
    at = CASES[name]["resume"]["at"]
    save = tmp_path / "checkpoints"
    first, second = tmp_path / "first.jsonl", tmp_path / "second.jsonl"
    assert main(ramp_argv(name, tiny_prefix, cache_dir, first, save=str(save), save_interval=at)) == 0
    (save / LATEST_FILE).write_text(f"{at}\n")  # resume from the middle, as if the run had stopped there
    assert main(ramp_argv(name, tiny_prefix, cache_dir, second, load=str(save))) == 0
    golden_lr, golden_batch = GOLDEN[f"{name}.lr"], GOLDEN[f"{name}.global_batch_size"]
    np.testing.assert_allclose(logged(second, "lr"), golden_lr[at:], rtol=RELATIVE_TOLERANCE, atol=0)
    assert logged(second, "global_batch_size") == golden_batch[at:].tolist()


def test_a_ramp_reads_the_samples_in_the_global_order():
    """Step boundaries move, the order of the samples does not (Megatron's sampler)."""
    dataset = [{"id": index} for index in range(64)]

    def collate(items, vocab_size):
        return [item["id"] for item in items]

    ramp = RampupBatchSize(start=2, increment=2, samples=20, final=8)
    steps = list(step_iterator(dataset, 0, 2, 4, 0, 1, 64, collate, ramp))
    # 20 samples in 3 increments: one every 6.67 consumed samples.
    assert [sum(map(len, step)) for step in steps[:7]] == [2, 2, 2, 2, 4, 4, 6]
    assert [sample for step in steps for microbatch in step for sample in microbatch] == \
        list(range(sum(sum(map(len, step)) for step in steps)))


@pytest.mark.parametrize(("flags", "expected"), [
    (["--rampup-batch-size", "2", "2", "40", "--train-samples", "80"], "--rampup-batch-size needs --global-batch-size"),
    (["--rampup-batch-size", "2", "2", "40", "--step-batch-size-schedule", "0:2", "--global-batch-size", "8"],
     "give either --rampup-batch-size or --step-batch-size-schedule"),
    (["--rampup-batch-size", "2", "4", "40", "--global-batch-size", "8"], "non-negative multiple of the increment"),
    (["--step-batch-size-schedule", "0:3 480:4", "--train-samples", "80"],
     "global batch size 3 is not a multiple of --micro-batch-size x data-parallel size (2)"),
    (["--step-batch-size-schedule", "1K:2 2K:4", "--train-samples", "80"], "the first threshold must be 0"),
    (["--step-batch-size-schedule", "0:2 480:4", "--train-samples", "80", "--pipeline-model-parallel-size", "2",
      "--nproc-per-node", "2"], "does not combine with --pipeline-model-parallel-size > 1"),
])
def test_what_cannot_apply_is_one_line(flags, expected, tiny_prefix, cache_dir, tmp_path, capsys):
    base = argv_for(dataclasses.replace(tiny_config(tiny_prefix, cache_dir, num_layers=2, hidden_size=16),
                                        optimizer=OptimizerConfig(lr=3e-3),
                                        training=TrainingConfig(micro_batch_size=2, device="cpu")))
    before = sorted(tmp_path.rglob("*"))
    assert main([*base, *flags]) != 0
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in lines[0], lines
    assert expected in lines[0]
    assert sorted(tmp_path.rglob("*")) == before
