"""The learning rate, the embedding/output layer's learning rate (--decoupled-lr), the weight decay and the global
batch size of every step equal megatron-core's `OptimizerParamScheduler` and batch-size calculators, driven the
way Megatron's training loop drives them, for every flag set of the grid in
``data_test/trainer/megatron_schedules.npz`` (made by ``make_megatron_schedule_golden.py``): each decay style, WSD
with each annealing, warm-up by iterations / fraction / samples, --lr-warmup-init, sample-based runs, weight-decay
increments, decoupled rates, both batch-size ramps, and resumes in warm-up, in decay, in a ramp, with
--override-opt_param-scheduler and with --use-checkpoint-opt_param-scheduler.

The arithmetic is the same Python float expressions in the same order, so the values agree to the last bit but
for the rounding of an expression written differently (relative 1e-12).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from trainer.optim.batch_size_schedule import RampupBatchSize, parse_step_batch_size_schedule, train_iters_for_samples
from trainer.config import OptimizerConfig, TrainingConfig
from trainer.optim.lr_schedule import ParamScheduler

GOLDEN_FILE = Path(__file__).resolve().parents[2] / "data_test" / "trainer" / "megatron_schedules.npz"
RELATIVE_TOLERANCE = 1e-12
GOLDEN = np.load(GOLDEN_FILE)
CASES = json.loads(str(GOLDEN["cases_json"]))
DEFAULTS = json.loads(str(GOLDEN["defaults_json"]))
OPTIMIZER_FIELDS = frozenset(OptimizerConfig.__dataclass_fields__)


def _configs(flags: dict) -> tuple[OptimizerConfig, TrainingConfig, dict]:
    """Our configs for a case's Megatron flags (the same names), and the full flag set."""
    args = {**DEFAULTS, **flags}
    optimizer_flags = {k: v for k, v in args.items() if k in OPTIMIZER_FIELDS and v is not None}
    optimizer = OptimizerConfig(**optimizer_flags)
    # The schedule only reads the run's length (the ramps' train loop: test_megatron_flags_batch_ramps.py).
    gbs = args["global_batch_size"] or args["micro_batch_size"] * args["data_parallel_size"]
    training = TrainingConfig(train_iters=args["train_iters"], train_samples=args["train_samples"],
                              global_batch_size=gbs if args["train_samples"] else None)
    return optimizer, training, args | {"global_batch_size": gbs}


def _batch_sizes(args: dict):
    if args["step_batch_size_schedule"] is not None:
        return parse_step_batch_size_schedule(args["step_batch_size_schedule"], args["seq_length"]), None
    if args["rampup_batch_size"] is not None:
        start, increment, samples = args["rampup_batch_size"]
        return RampupBatchSize(start, increment, samples, args["global_batch_size"]), samples
    return None, None


def _scheduler(flags: dict) -> tuple[ParamScheduler, dict, object, int]:
    optimizer, training, args = _configs(flags)
    schedule, rampup_samples = _batch_sizes(args)
    steps = training.train_iters if args["train_samples"] is None else \
        train_iters_for_samples(args["train_samples"], schedule, args["global_batch_size"], rampup_samples)
    return optimizer.scheduler(training, args["global_batch_size"]), args, schedule, steps


def run_ours(case: dict) -> dict[str, np.ndarray]:
    flags, resume = case["flags"], case["resume"]
    scheduler, args, schedule, steps = _scheduler(flags)
    rows, consumed = [], 0
    for iteration in range(steps):
        if resume is not None and iteration == resume["at"]:
            saved = scheduler.state_dict()
            scheduler, args, schedule, _ = _scheduler({**flags, **resume["flags"]})
            scheduler.load_state_dict(saved)
        gbs = args["global_batch_size"] if schedule is None else schedule(consumed)
        decoupled = float("nan") if args["decoupled_lr"] is None else \
            scheduler.lr(args["decoupled_lr"], args["decoupled_min_lr"])
        rows.append((scheduler.lr(), decoupled, scheduler.wd(), gbs))
        scheduler.step(gbs)
        consumed += gbs
    lr, decoupled_lr, wd, gbs = zip(*rows)
    return {"lr": np.array(lr), "decoupled_lr": np.array(decoupled_lr), "wd": np.array(wd),
            "global_batch_size": np.array(gbs)}


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_step_matches_megatron(name):
    ours = run_ours(CASES[name])
    for key in ("lr", "decoupled_lr", "wd"):
        np.testing.assert_allclose(ours[key], GOLDEN[f"{name}.{key}"], rtol=RELATIVE_TOLERANCE, atol=0,
                                   equal_nan=True, err_msg=f"{name}: {key}")
    np.testing.assert_array_equal(ours["global_batch_size"], GOLDEN[f"{name}.global_batch_size"])


def test_the_grid_covers_the_flags():
    flag_sets = [case["flags"] | (case["resume"] or {}).get("flags", {}) for case in CASES.values()]
    seen = {(key, str(value)) for flags in flag_sets for key, value in flags.items()}
    for style in ("constant", "linear", "cosine", "inverse-square-root", "WSD"):
        assert ("lr_decay_style", style) in seen or style == DEFAULTS["lr_decay_style"]
    for style in ("exponential", "linear", "cosine", "minus_sqrt"):
        assert ("lr_wsd_decay_style", style) in seen
    names = {key for key, _ in seen}
    assert {"lr_warmup_iters", "lr_warmup_fraction", "lr_warmup_samples", "lr_warmup_init", "train_samples",
            "lr_decay_samples", "lr_wsd_decay_samples", "start_weight_decay", "decoupled_lr", "decoupled_min_lr",
            "rampup_batch_size", "step_batch_size_schedule", "override_opt_param_scheduler",
            "use_checkpoint_opt_param_scheduler"} <= names


def test_step_one_runs_at_the_warmup_init_and_each_step_at_the_samples_before_it():
    """The issue's measurement: warm-up 2 of 10 steps, lr 1e-3, min 1e-4."""
    np.testing.assert_allclose(run_ours(CASES["linear_warmup_iters"])["lr"][:4], [0.0, 5e-4, 1e-3, 8.875e-4])
