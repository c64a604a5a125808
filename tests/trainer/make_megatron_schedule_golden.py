"""The learning-rate and weight-decay golden arrays: megatron-core's own `OptimizerParamScheduler`, driven the
way Megatron-LM's training loop drives it, over a grid of flag sets, written to
``data_test/trainer/megatron_schedules.npz``.

    python3 -m venv /tmp/mcore && /tmp/mcore/bin/pip install torch megatron-core==0.16.1 numpy
    git -C <Megatron-LM checkout> show d98e8a6:megatron/core/num_microbatches_calculator.py > /tmp/step_calc.py
    /tmp/mcore/bin/python tests/trainer/make_megatron_schedule_golden.py /tmp/step_calc.py   # rewrites the .npz

The scheduler of megatron-core 0.16.1 computes the same numbers as Megatron-LM's HEAD (2026-08, d98e8a6): the
two differ only in tensor-valued ``lr`` support. ``--rampup-batch-size`` is 0.16.1's
`RampupBatchsizeNumMicroBatchesCalculator` (HEAD still accepts the flag but ignores it, deprecated);
``--step-batch-size-schedule`` exists only at HEAD, so its calculator is loaded from the file given.

What the loop does (megatron/training/training.py): the scheduler is built with its warm-up/decay/weight-decay
lengths in samples (`get_optimizer_param_scheduler`; a sample-based run first sizes ``train_iters`` with
`update_train_iters`), its constructor calls ``step(0)``, and after every successful optimiser step
``step(increment=num_microbatches * micro_batch_size * data_parallel_size)``; so step i runs at the rate of the
samples consumed before it. The number of micro-batches follows the consumed samples
(``update_num_microbatches(consumed_train_samples)`` before each step). A resume builds a new scheduler from the
(possibly changed) flags and calls ``load_state_dict`` with the saved one.

The test (`test_megatron_schedule_golden.py`) needs only numpy and the .npz.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
from megatron.core import num_microbatches_calculator as rampup_calculators
from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

ROOT = Path(__file__).resolve().parents[2]
GOLDEN_FILE = ROOT / "data_test" / "trainer" / "megatron_schedules.npz"

# Megatron's defaults for the flags a case leaves out (megatron/training/config/training_config.py, arguments.py).
DEFAULTS = {
    "lr": 1e-3, "min_lr": 1e-4, "lr_decay_style": "linear", "lr_wsd_decay_style": "exponential",
    "lr_decay_iters": None, "lr_decay_samples": None, "lr_wsd_decay_iters": None, "lr_wsd_decay_samples": None,
    "lr_warmup_fraction": None, "lr_warmup_iters": 0, "lr_warmup_samples": 0, "lr_warmup_init": 0.0,
    "train_iters": None, "train_samples": None, "global_batch_size": 4, "micro_batch_size": 1,
    "data_parallel_size": 2, "seq_length": 16, "weight_decay": 0.01, "weight_decay_incr_style": "constant",
    "start_weight_decay": None, "end_weight_decay": None, "decoupled_lr": None, "decoupled_min_lr": None,
    "rampup_batch_size": None, "step_batch_size_schedule": None,
    "override_opt_param_scheduler": False, "use_checkpoint_opt_param_scheduler": False,
}

WSD = {"lr_decay_style": "WSD", "lr_warmup_iters": 3, "lr_wsd_decay_iters": 8, "train_iters": 30}
SAMPLES = {"micro_batch_size": 2, "data_parallel_size": 1, "global_batch_size": 6}
# name -> (flags, resume): ``resume`` = {"at": iteration, "flags": flags changed for the resumed run}.
CASES: dict[str, tuple[dict, dict | None]] = {
    "linear_warmup_iters": ({"lr_warmup_iters": 2, "train_iters": 10}, None),
    "cosine_past_decay_end": ({"lr_decay_style": "cosine", "lr_warmup_iters": 3, "lr_decay_iters": 20,
                               "train_iters": 24}, None),
    "constant_warmup": ({"lr_decay_style": "constant", "lr_warmup_iters": 2, "train_iters": 8}, None),
    "inverse_square_root": ({"lr_decay_style": "inverse-square-root", "lr_warmup_iters": 4, "train_iters": 30},
                            None),
    "inverse_square_root_no_warmup": ({"lr_decay_style": "inverse-square-root", "train_iters": 20}, None),
    "wsd_exponential": ({**WSD, "lr_wsd_decay_style": "exponential"}, None),
    "wsd_linear": ({**WSD, "lr_wsd_decay_style": "linear"}, None),
    "wsd_cosine": ({**WSD, "lr_wsd_decay_style": "cosine"}, None),
    "wsd_minus_sqrt": ({**WSD, "lr_wsd_decay_style": "minus_sqrt"}, None),
    "warmup_fraction_iters": ({"lr_decay_style": "cosine", "lr_warmup_fraction": 0.15, "lr_decay_iters": 25,
                               "train_iters": 30}, None),
    "warmup_init": ({"lr_warmup_iters": 4, "lr_warmup_init": 2e-4, "train_iters": 12}, None),
    "no_warmup_linear": ({"train_iters": 12}, None),
    "wd_linear": ({"lr_decay_style": "cosine", "lr_warmup_iters": 2, "train_iters": 20,
                   "weight_decay_incr_style": "linear", "start_weight_decay": 0.0, "end_weight_decay": 0.1}, None),
    "wd_cosine": ({"lr_decay_style": "cosine", "lr_warmup_iters": 2, "train_iters": 20,
                   "weight_decay_incr_style": "cosine", "start_weight_decay": 0.02, "end_weight_decay": 0.1}, None),
    "decoupled_lr": ({"lr_decay_style": "cosine", "lr_warmup_iters": 3, "train_iters": 20, "decoupled_lr": 2e-3,
                      "decoupled_min_lr": 2e-4}, None),
    "decoupled_lr_only": ({"lr_warmup_iters": 3, "train_iters": 20, "decoupled_lr": 5e-4}, None),
    "samples_cosine": ({**SAMPLES, "lr_decay_style": "cosine", "train_samples": 150, "lr_warmup_samples": 20,
                        "lr_decay_samples": 120}, None),
    "samples_warmup_fraction": ({**SAMPLES, "train_samples": 100, "lr_warmup_fraction": 0.1}, None),
    "samples_wsd": ({**SAMPLES, "lr_decay_style": "WSD", "lr_wsd_decay_style": "cosine", "train_samples": 150,
                     "lr_warmup_samples": 12, "lr_wsd_decay_samples": 40}, None),
    "samples_wd_linear": ({**SAMPLES, "train_samples": 120, "lr_warmup_samples": 12,
                           "weight_decay_incr_style": "linear", "start_weight_decay": 0.01,
                           "end_weight_decay": 0.05}, None),
    "rampup_batch_size": ({"micro_batch_size": 2, "data_parallel_size": 1, "global_batch_size": 8,
                           "rampup_batch_size": [2, 2, 40], "lr_decay_style": "cosine", "train_samples": 200,
                           "lr_warmup_samples": 16}, None),
    "step_batch_size_schedule": ({"micro_batch_size": 2, "data_parallel_size": 1, "global_batch_size": None,
                                  "step_batch_size_schedule": "0:2 480:4 1.28K:8", "lr_decay_style": "cosine",
                                  "train_samples": 200, "lr_warmup_samples": 16}, None),
    "resume_in_warmup": ({"lr_warmup_iters": 6, "train_iters": 20}, {"at": 3, "flags": {}}),
    "resume_in_decay": ({"lr_decay_style": "cosine", "lr_warmup_iters": 3, "train_iters": 20,
                         "weight_decay_incr_style": "linear", "start_weight_decay": 0.0, "end_weight_decay": 0.1},
                        {"at": 12, "flags": {}}),
    "resume_override": ({"lr_decay_style": "cosine", "lr_warmup_iters": 3, "train_iters": 20},
                        {"at": 10, "flags": {"lr": 5e-4, "min_lr": 0.0, "lr_decay_style": "linear",
                                             "override_opt_param_scheduler": True}}),
    "resume_use_checkpoint": ({"lr_decay_style": "cosine", "lr_warmup_iters": 3, "train_iters": 20},
                              {"at": 10, "flags": {"lr": 5e-4, "min_lr": 0.0, "lr_decay_style": "linear",
                                                   "use_checkpoint_opt_param_scheduler": True}}),
    "resume_in_rampup": ({"micro_batch_size": 2, "data_parallel_size": 1, "global_batch_size": 8,
                          "rampup_batch_size": [2, 2, 40], "train_samples": 160, "lr_warmup_samples": 16},
                         {"at": 5, "flags": {}}),
}


def load_step_calculators(path: str):
    spec = importlib.util.spec_from_file_location("step_batch_size_calculators", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class ParamGroups:
    """What the scheduler sees of an optimiser: the default group, and the embedding/output group with its own
    max/min lr when --decoupled-lr is given (megatron.core.optimizer.get_standard_config_overrides)."""

    def __init__(self, args: dict) -> None:
        self.param_groups = [{"wd_mult": 1.0}]
        if args["decoupled_lr"] is not None:
            group = {"wd_mult": 1.0, "max_lr": args["decoupled_lr"]}
            if args["decoupled_min_lr"] is not None:
                group["min_lr"] = args["decoupled_min_lr"]
            self.param_groups.append(group)


def finish_args(flags: dict) -> dict:
    """arguments.py's validation: constant weight decay sets start = end = --weight-decay; the step schedule
    leaves --global-batch-size at micro x dp."""
    args = {**DEFAULTS, **flags}
    if args["weight_decay_incr_style"] == "constant":
        args["start_weight_decay"] = args["end_weight_decay"] = args["weight_decay"]
    if args["global_batch_size"] is None:
        args["global_batch_size"] = args["micro_batch_size"] * args["data_parallel_size"]
    return args


def build_calculator(args: dict, step_calculators):
    micro, dp = args["micro_batch_size"], args["data_parallel_size"]
    if args["step_batch_size_schedule"] is not None:
        return step_calculators.StepBatchsizeNumMicroBatchesCalculator(
            micro, dp, False, 1, args["step_batch_size_schedule"], args["seq_length"])
    if args["rampup_batch_size"] is not None:
        start, increment, samples = args["rampup_batch_size"]
        return rampup_calculators.RampupBatchsizeNumMicroBatchesCalculator(
            args["global_batch_size"], micro, dp, False, 1, start, increment, samples)
    return rampup_calculators.ConstantNumMicroBatchesCalculator(args["global_batch_size"], micro, dp, False, 1)


def update_train_iters(args: dict, calculator) -> None:
    """training.py's `update_train_iters` (HEAD for the step schedule, 0.16.1's loop for the ramp)."""
    if args["train_iters"]:
        return
    if args["step_batch_size_schedule"] is not None:
        iterations = consumed = 0
        while consumed < args["train_samples"]:
            calculator.update(consumed, False)
            consumed += calculator.get_current_global_batch_size()
            iterations += 1
        calculator.update(0, False)
        args["train_iters"] = iterations
    elif args["rampup_batch_size"] is not None:
        iterations = consumed = 0
        while consumed <= int(args["rampup_batch_size"][2]) and consumed <= args["train_samples"]:
            calculator.update(consumed, False)
            consumed += calculator.get_current_global_batch_size()
            iterations += 1
        calculator.update(0, False)
        if args["train_samples"] > consumed:
            iterations += (args["train_samples"] - consumed) // args["global_batch_size"]
        args["train_iters"] = iterations
    else:
        args["train_iters"] = args["train_samples"] // args["global_batch_size"]


def build_scheduler(args: dict, calculator) -> OptimizerParamScheduler:
    """training.py's `get_optimizer_param_scheduler`."""
    gbs = args["global_batch_size"]
    if args["train_samples"] is None:
        decay_iters = args["lr_decay_iters"] if args["lr_decay_iters"] is not None else args["train_iters"]
        lr_decay_steps = decay_iters * gbs
        wd_incr_steps = args["train_iters"] * gbs
        wsd_decay_steps = None if args["lr_wsd_decay_iters"] is None else args["lr_wsd_decay_iters"] * gbs
        lr_warmup_steps = (args["lr_warmup_fraction"] * lr_decay_steps if args["lr_warmup_fraction"] is not None
                           else args["lr_warmup_iters"] * gbs)
    else:
        update_train_iters(args, calculator)
        lr_decay_steps = args["lr_decay_samples"] if args["lr_decay_samples"] is not None else args["train_samples"]
        wd_incr_steps = args["train_samples"]
        wsd_decay_steps = args["lr_wsd_decay_samples"]
        lr_warmup_steps = (args["lr_warmup_fraction"] * lr_decay_steps if args["lr_warmup_fraction"] is not None
                           else args["lr_warmup_samples"])
    return OptimizerParamScheduler(
        ParamGroups(args), init_lr=args["lr_warmup_init"], max_lr=args["lr"], min_lr=args["min_lr"],
        lr_warmup_steps=lr_warmup_steps, lr_decay_steps=lr_decay_steps, lr_decay_style=args["lr_decay_style"],
        start_wd=args["start_weight_decay"], end_wd=args["end_weight_decay"], wd_incr_steps=wd_incr_steps,
        wd_incr_style=args["weight_decay_incr_style"],
        use_checkpoint_opt_param_scheduler=args["use_checkpoint_opt_param_scheduler"],
        override_opt_param_scheduler=args["override_opt_param_scheduler"], wsd_decay_steps=wsd_decay_steps,
        lr_wsd_decay_style=args["lr_wsd_decay_style"])


def run_case(flags: dict, resume: dict | None, step_calculators) -> dict[str, np.ndarray]:
    """Per step: the lr, decoupled lr (NaN without --decoupled-lr) and weight decay it runs at, and its
    global batch size."""
    args = finish_args(flags)
    calculator = build_calculator(args, step_calculators)
    scheduler = build_scheduler(args, calculator)
    rows = []
    consumed = 0
    for iteration in range(args["train_iters"]):
        if resume is not None and iteration == resume["at"]:
            saved = scheduler.state_dict()
            args = finish_args({**flags, **resume["flags"]})
            calculator = build_calculator(args, step_calculators)
            scheduler = build_scheduler(args, calculator)
            scheduler.load_state_dict(saved)
        calculator.update(consumed, True)
        groups = scheduler.optimizer.param_groups
        decoupled = groups[1]["lr"] if len(groups) > 1 else float("nan")
        rows.append((groups[0]["lr"], decoupled, groups[0]["weight_decay"], calculator.get_current_global_batch_size()))
        increment = calculator.get() * args["micro_batch_size"] * args["data_parallel_size"]
        scheduler.step(increment=increment)
        consumed += increment
    lr, decoupled_lr, wd, gbs = zip(*rows)
    return {"lr": np.array(lr, np.float64), "decoupled_lr": np.array(decoupled_lr, np.float64),
            "wd": np.array(wd, np.float64), "global_batch_size": np.array(gbs, np.int64)}


def main(argv: list[str]) -> int:
    step_calculators = load_step_calculators(argv[0])
    arrays: dict[str, np.ndarray] = {}
    for name, (flags, resume) in CASES.items():
        for key, values in run_case(flags, resume, step_calculators).items():
            arrays[f"{name}.{key}"] = values
    arrays["cases_json"] = np.array(json.dumps({name: {"flags": flags, "resume": resume}
                                                for name, (flags, resume) in CASES.items()}))
    arrays["defaults_json"] = np.array(json.dumps(DEFAULTS))
    GOLDEN_FILE.parent.mkdir(parents=True, exist_ok=True)
    partial = GOLDEN_FILE.with_suffix(".partial.npz")
    np.savez_compressed(partial, **arrays)
    partial.replace(GOLDEN_FILE)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
