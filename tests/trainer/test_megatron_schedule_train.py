"""`train` runs at Megatron's learning rate at every step: the ``lr`` of each step in metrics.jsonl equals
megatron-core's (``data_test/trainer/megatron_schedules.npz``) for the same flags, typed as a Megatron user types
them, also across a resume in the middle of the decay (the schedule is in the checkpoint) and with
--use-checkpoint-opt_param-scheduler; the embedding and output layer take --decoupled-lr; the schedule flags
parse with Megatron's names and defaults, and the ones that cannot apply are one line naming the flag.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from test_megatron_schedule_golden import CASES, DEFAULTS, GOLDEN, RELATIVE_TOLERANCE
from trainer_testing import argv_for, tiny_config

from samplers.run_length import RunLength
from trainer.checkpoint.store import LATEST_FILE
from trainer.cli.train import main
from trainer.cli.train_args import build_parser, config_from_args
from trainer.config import OptimizerConfig, TrainingConfig
from trainer.errors import TrainConfigError
from trainer.models.gpt.model import TIED_COPY_NAME, TIED_WEIGHT_NAME
from trainer.optim.optimizer import apply_schedule, build_optimizer, embedding_and_output_names

OPTIMIZER_FIELDS = frozenset(OptimizerConfig.__dataclass_fields__)
# The unit test's global batch (iteration-based lengths scale with it; the rates do not).
BATCH = 8


def case_argv(name: str, prefix: str, cache: str, metrics: Path, changed: dict | None = None,
              **checkpoint) -> list[str]:
    """The ``train`` command line of golden case ``name`` (its Megatron flags, plus ``changed``)."""
    args = {**DEFAULTS, **CASES[name]["flags"], **(changed or {})}
    # One layer: the schedule is what is tested, not the model.
    config = tiny_config(prefix, cache, num_layers=1, metrics_file=str(metrics), **checkpoint)
    # The golden run's global batch (inverse-square-root depends on it), in one micro-batch.
    by_samples, batch = args["train_samples"] is not None, args["global_batch_size"]
    training = TrainingConfig(micro_batch_size=batch, global_batch_size=batch, device="cpu",
                              train_iters=None if by_samples else args["train_iters"],
                              train_samples=args["train_samples"])
    optimizer = OptimizerConfig(clip_grad=0.5, **{key: value for key, value in args.items()
                                                  if key in OPTIMIZER_FIELDS and value is not None})
    config = dataclasses.replace(config, training=training, optimizer=optimizer,
                                 logging=dataclasses.replace(config.logging, log_interval=1))
    return argv_for(config)


def logged_lrs(metrics: Path) -> list[float]:
    return [record["lr"] for record in map(json.loads, metrics.read_text().splitlines()) if "lr" in record]


@pytest.mark.parametrize("name", ["linear_warmup_iters", "warmup_init", "wsd_minus_sqrt",
                                  "inverse_square_root_no_warmup", "samples_warmup_fraction"])
def test_train_logs_megatrons_rate_at_every_step(name, tiny_prefix, cache_dir, tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    assert main(case_argv(name, tiny_prefix, cache_dir, metrics)) == 0
    np.testing.assert_allclose(logged_lrs(metrics), GOLDEN[f"{name}.lr"], rtol=RELATIVE_TOLERANCE, atol=0)


@pytest.mark.parametrize("name", ["resume_in_decay", "resume_use_checkpoint"])
def test_a_resumed_run_continues_megatrons_schedule(name, tiny_prefix, cache_dir, tmp_path):
    """The run saves at the case's resume step; the resume (with the case's changed flags) logs the rest."""
    at, changed = CASES[name]["resume"]["at"], CASES[name]["resume"]["flags"]
    save = tmp_path / "checkpoints"
    first = tmp_path / "first.jsonl"
    assert main(case_argv(name, tiny_prefix, cache_dir, first, save=str(save), save_interval=at)) == 0
    (save / LATEST_FILE).write_text(f"{at}\n")  # resume from the middle, as if the run had stopped there
    second = tmp_path / "second.jsonl"
    assert main(case_argv(name, tiny_prefix, cache_dir, second, changed, load=str(save))) == 0
    golden = GOLDEN[f"{name}.lr"]
    np.testing.assert_allclose(logged_lrs(first)[:at], golden[:at], rtol=RELATIVE_TOLERANCE, atol=0)
    np.testing.assert_allclose(logged_lrs(second), golden[at:], rtol=RELATIVE_TOLERANCE, atol=0)


def test_a_changed_schedule_on_resume_needs_one_of_the_two_flags(tiny_prefix, cache_dir, tmp_path, capsys):
    save = tmp_path / "checkpoints"
    assert main(case_argv("resume_in_decay", tiny_prefix, cache_dir, tmp_path / "m1", save=str(save))) == 0
    capsys.readouterr()
    argv = case_argv("resume_in_decay", tiny_prefix, cache_dir, tmp_path / "m2", {"lr": 5e-4}, load=str(save))
    assert main(argv) != 0
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert "max_lr 0.001, this run 0.0005" in err and "--override-opt_param-scheduler" in err


def test_decoupled_lr_applies_to_the_embedding_and_output_layer():
    """Megatron's decoupled_lr case, on the parameter groups `train` builds."""
    embedding = torch.nn.Parameter(torch.zeros(4, 2))
    params = [(TIED_WEIGHT_NAME, embedding), ("layers.0.mlp.weight", torch.nn.Parameter(torch.zeros(2, 2))),
              ("layers.0.norm.weight", torch.nn.Parameter(torch.zeros(2)))]
    decoupled = embedding_and_output_names(params, (TIED_WEIGHT_NAME, TIED_COPY_NAME))
    assert decoupled == {TIED_WEIGHT_NAME}
    args = {**DEFAULTS, **CASES["decoupled_lr"]["flags"]}
    config = OptimizerConfig(**{k: v for k, v in args.items() if k in OPTIMIZER_FIELDS and v is not None})
    optimizer = build_optimizer(params, config, decoupled=decoupled)
    scheduler = config.scheduler(TrainingConfig(train_iters=args["train_iters"]), BATCH)
    lrs, embedding_lrs, wds = [], [], []
    for _ in range(args["train_iters"]):
        apply_schedule(optimizer, scheduler)
        groups = {id(p): g for g in optimizer.param_groups for p in g["params"]}
        lrs.append(groups[id(params[1][1])]["lr"])
        embedding_lrs.append(groups[id(embedding)]["lr"])
        wds.append(groups[id(params[1][1])]["weight_decay"])
        assert groups[id(params[2][1])]["weight_decay"] == 0.0, "norms are not decayed"
        scheduler.step(BATCH)
    np.testing.assert_allclose(lrs, GOLDEN["decoupled_lr.lr"], rtol=RELATIVE_TOLERANCE, atol=0)
    np.testing.assert_allclose(embedding_lrs, GOLDEN["decoupled_lr.decoupled_lr"], rtol=RELATIVE_TOLERANCE, atol=0)
    np.testing.assert_allclose(wds, GOLDEN["decoupled_lr.wd"], rtol=RELATIVE_TOLERANCE, atol=0)


def parse(argv: list[str]):
    return config_from_args(build_parser().parse_args(["--dataset", "p", *argv]))


def test_megatron_names_and_defaults():
    config = parse([])
    assert config.optimizer.lr_decay_style == "linear"
    assert config.optimizer.lr_wsd_decay_style == "exponential"
    assert config.optimizer.weight_decay_incr_style == "constant"
    assert config.optimizer.lr_warmup_init == 0.0
    assert config.training.train_iters == 100
    config = parse(["--override-opt_param-scheduler", "--optimizer", "adam", "--train-samples", "96",
                    "--global-batch-size", "8", "--lr-warmup-samples", "16", "--lr-decay-samples", "64",
                    "--lr-decay-style", "WSD", "--lr-wsd-decay-style", "minus_sqrt", "--lr-wsd-decay-samples", "8",
                    "--weight-decay-incr-style", "cosine", "--start-weight-decay", "0.01",
                    "--end-weight-decay", "0.1", "--decoupled-lr", "1e-3", "--decoupled-min-lr", "1e-5",
                    "--lr-warmup-init", "1e-6"])
    assert config.optimizer.override_opt_param_scheduler and config.optimizer.optimizer == "adam"
    assert config.training.train_iters == 12
    assert parse(["--use-checkpoint-opt_param-scheduler"]).optimizer.use_checkpoint_opt_param_scheduler
    assert parse(["--use-checkpoint-opt-param-scheduler"]).optimizer.use_checkpoint_opt_param_scheduler


@pytest.mark.parametrize(("argv", "expected"), [
    (["--train-iters", "10", "--lr-warmup-samples", "8"], "--lr-warmup-samples does not apply to a run sized by"),
    (["--train-samples", "80", "--global-batch-size", "8", "--lr-warmup-iters", "2"],
     "--lr-warmup-iters does not apply to a run sized by --train-samples"),
    (["--train-samples", "80", "--global-batch-size", "8", "--train-iters", "5"],
     "give either --train-iters or --train-samples"),
    (["--train-samples", "80"], "--train-samples needs --global-batch-size"),
    (["--lr-decay-style", "WSD"], "needs --lr-wsd-decay-iters or --lr-wsd-decay-samples"),
    (["--lr-wsd-decay-iters", "3"], "need --lr-decay-style WSD"),
    (["--start-weight-decay", "0.1"], "need --weight-decay-incr-style linear or cosine"),
    (["--weight-decay-incr-style", "linear"], "needs --start-weight-decay and --end-weight-decay"),
    (["--decoupled-min-lr", "1e-5"], "--decoupled-min-lr needs --decoupled-lr"),
    (["--lr-warmup-init", "1", "--lr", "0.5"], "--lr-warmup-init (1.0) is larger than lr (0.5)"),
    (["--override-opt_param-scheduler", "--use-checkpoint-opt_param-scheduler"],
     "give either --override-opt-param-scheduler or --use-checkpoint-opt-param-scheduler"),
])
def test_schedule_flags_that_cannot_apply_are_one_line(argv, expected, tiny_prefix, cache_dir, capsys):
    config = tiny_config(tiny_prefix, cache_dir)
    # The tiny run without its schedule and run-length flags: the case gives them.
    base = argv_for(dataclasses.replace(config, optimizer=OptimizerConfig(lr=3e-3),
                                        training=TrainingConfig(micro_batch_size=2, device="cpu")))
    assert main(base + argv) != 0
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert expected in err


def test_a_run_extended_on_resume_decays_over_its_new_length(caplog):
    """Where Megatron stops (a changed run length changes the default decay length), the lengths no flag gave
    follow the new run, with one warning each; a length a flag gave must still agree."""
    short = OptimizerConfig(lr_warmup_iters=2).scheduler(TrainingConfig(train_iters=10), BATCH)
    short.step(5 * BATCH)
    extended = OptimizerConfig(lr_warmup_iters=2).scheduler(TrainingConfig(train_iters=20), BATCH)
    extended.load_state_dict(short.state_dict())
    assert (extended.lr_decay_steps, extended.wd_incr_steps, extended.num_steps) == (20 * BATCH, 20 * BATCH,
                                                                                     5 * BATCH)
    assert sum("the run's length changed" in record.getMessage() for record in caplog.records) == 2
    given = OptimizerConfig(lr_warmup_iters=2, lr_decay_iters=10).scheduler(TrainingConfig(train_iters=20), BATCH)
    explicit = OptimizerConfig(lr_warmup_iters=2, lr_decay_iters=12).scheduler(TrainingConfig(train_iters=20), BATCH)
    with pytest.raises(TrainConfigError, match="lr_decay_steps 80, this run 96"):
        explicit.load_state_dict(given.state_dict())


def test_a_run_sized_in_samples_asks_its_train_split_for_them():
    """Megatron's split sizes: --train-samples, not the whole batches of the steps."""
    run = RunLength(train_iters=16, global_batch_size=6, eval_interval=1000, eval_iters=1, train_samples=100)
    assert run.sizes() == (100, 6 * (16 // 1000 + 1), 6)
    assert run.explain("train") == "--train-samples 100 = 100"
