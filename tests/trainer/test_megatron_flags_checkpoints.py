"""Megatron's checkpoint flags (issue 29, section 3), with Megatron's meaning:

- ``--no-save-optim`` / ``--no-save-rng``: the checkpoint holds no optimiser state, loss scale and schedule / no
  generator states; a run resuming from a checkpoint without optimiser state continues the iteration and
  starts the optimiser and the schedule afresh (Megatron reads its ``no_save_optim``).
- ``--no-load-optim``: the weights, iteration and consumed samples resume; the optimiser and the learning-rate
  schedule start afresh (the first resumed step runs at the schedule's step-0 rate).
- ``--no-load-rng``: the generators are not restored (dropout draws anew: the continuous run's losses differ).
- ``--finetune``: weights only; the iteration restarts at 0.
- ``--ckpt-format torch_dist`` is ours; ``torch`` is refused in one line saying why; a Megatron torch-format
  checkpoint under ``--load`` is refused in one line naming its file (``--auto-detect-ckpt-format`` or not).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from trainer_testing import argv_for, tiny_config

from trainer.checkpoint.load import saved_names
from trainer.checkpoint.store import MODEL_PREFIX, OPTIMIZER_PREFIX, latest_iteration
from trainer.cli.train import main
from trainer.train import train

STEPS = 3


def config_for(tiny_prefix, cache_dir, tmp_path, name: str, train_iters: int = STEPS, load: str | None = None,
               dropout: float = 0.0, **checkpoint_flags):
    config = tiny_config(tiny_prefix, cache_dir, train_iters=train_iters, num_layers=2, hidden_size=16,
                         save=str(tmp_path / name), load=load, metrics_file=str(tmp_path / f"{name}.jsonl"))
    config.logging.log_interval = 1
    config.model.hidden_dropout = dropout
    config.checkpoint = dataclasses.replace(config.checkpoint, **checkpoint_flags)
    return config


def lrs(metrics_file: Path) -> list[float]:
    return [record["lr"] for record in map(json.loads, metrics_file.read_text().splitlines()) if "lr" in record]


def names_of(root: Path) -> frozenset[str]:
    return saved_names(root, latest_iteration(root))


@pytest.fixture(scope="module")
def full(tiny_prefix, cache_dir, tmp_path_factory):
    """A 3-step run's checkpoint (optimiser, schedule, generators) and its learning rates."""
    tmp_path = tmp_path_factory.mktemp("full")
    config = config_for(tiny_prefix, cache_dir, tmp_path, "run")
    train(config)
    return tmp_path / "run", lrs(tmp_path / "run.jsonl")


@pytest.mark.timeout(300)
def test_no_save_optim_and_no_save_rng_leave_those_tensors_out(tiny_prefix, cache_dir, tmp_path, full):
    config = config_for(tiny_prefix, cache_dir, tmp_path, "lean", no_save_optim=True, no_save_rng=True)
    train(config)
    lean, whole = names_of(tmp_path / "lean"), names_of(full[0])
    assert {name for name in whole if name.startswith(MODEL_PREFIX)} == {n for n in lean if n.startswith(MODEL_PREFIX)}
    assert "train.iteration" in lean
    assert not any(name.startswith((OPTIMIZER_PREFIX, "loss_scaler.", "opt_param_scheduler.", "rng."))
                   for name in lean)
    assert any(name.startswith(OPTIMIZER_PREFIX) for name in whole) and any(n.startswith("rng.") for n in whole)
    # Resuming from it continues the iteration, with the schedule from its start.
    resumed = config_for(tiny_prefix, cache_dir, tmp_path, "lean_resumed", train_iters=STEPS + 1,
                         load=str(tmp_path / "lean"))
    assert train(resumed).iteration == STEPS + 1
    assert lrs(tmp_path / "lean_resumed.jsonl") == full[1][:1]


@pytest.mark.timeout(300)
def test_no_load_optim_resumes_the_iteration_with_a_fresh_optimiser_and_schedule(tiny_prefix, cache_dir, tmp_path,
                                                                                 full):
    root, first_lrs = full
    result = train(config_for(tiny_prefix, cache_dir, tmp_path, "fresh_optim", train_iters=STEPS + 2,
                              load=str(root), no_load_optim=True))
    assert result.iteration == STEPS + 2 and result.consumed_samples == (STEPS + 2) * 8
    assert lrs(tmp_path / "fresh_optim.jsonl") == first_lrs[:2]  # the schedule's steps 0 and 1
    whole = train(config_for(tiny_prefix, cache_dir, tmp_path, "resumed", train_iters=STEPS + 2, load=str(root)))
    assert lrs(tmp_path / "resumed.jsonl")[0] != first_lrs[0]
    assert whole.losses[0] == result.losses[0]  # the same weights and data: only the optimiser differs after


@pytest.mark.timeout(300)
def test_finetune_takes_the_weights_only_and_restarts_at_iteration_0(tiny_prefix, cache_dir, tmp_path, full):
    root, first_lrs = full
    result = train(config_for(tiny_prefix, cache_dir, tmp_path, "tuned", train_iters=2, load=str(root),
                              finetune=True))
    assert result.iteration == 2 and result.consumed_samples == 16
    assert lrs(tmp_path / "tuned.jsonl") == first_lrs[:2]


@pytest.mark.timeout(300)
def test_no_load_rng_draws_dropout_anew(tiny_prefix, cache_dir, tmp_path):
    """With dropout, a full resume repeats the continuous run's losses; without the generators it does not."""
    continuous = train(config_for(tiny_prefix, cache_dir, tmp_path, "continuous", train_iters=2, dropout=0.5))
    train(config_for(tiny_prefix, cache_dir, tmp_path, "first", train_iters=1, dropout=0.5))
    again = train(config_for(tiny_prefix, cache_dir, tmp_path, "again", train_iters=2, dropout=0.5,
                             load=str(tmp_path / "first")))
    fresh = train(config_for(tiny_prefix, cache_dir, tmp_path, "fresh_rng", train_iters=2, dropout=0.5,
                             load=str(tmp_path / "first"), no_load_rng=True))
    assert again.losses == continuous.losses[1:]
    assert fresh.losses != continuous.losses[1:]


def run_main(argv: list[str], capsys) -> tuple[int, list[str]]:
    code = main(argv)
    return code, capsys.readouterr().err.splitlines()


def test_ckpt_format_torch_is_refused_in_one_line(tiny_prefix, cache_dir, tmp_path, capsys):
    argv = argv_for(tiny_config(tiny_prefix, cache_dir, train_iters=1, num_layers=1, hidden_size=16))
    before = sorted(tmp_path.iterdir())
    code, lines = run_main([*argv, "--ckpt-format", "torch", "--save", str(tmp_path / "run")], capsys)
    assert code != 0 and len(lines) == 1, lines
    assert "--ckpt-format torch" in lines[0] and "torch_dist" in lines[0] and "Traceback" not in lines[0]
    assert sorted(tmp_path.iterdir()) == before


@pytest.mark.timeout(300)
def test_ckpt_format_torch_dist_and_auto_detect_are_accepted(tiny_prefix, cache_dir, tmp_path, capsys, full):
    argv = argv_for(tiny_config(tiny_prefix, cache_dir, train_iters=STEPS + 1, num_layers=2, hidden_size=16))
    code, _ = run_main([*argv, "--ckpt-format", "torch_dist", "--auto-detect-ckpt-format", "--load", str(full[0]),
                        "--save", str(tmp_path / "run")], capsys)
    assert code == 0
    assert latest_iteration(tmp_path / "run") == STEPS + 1


@pytest.mark.parametrize("auto_detect", [[], ["--auto-detect-ckpt-format"]])
def test_a_megatron_torch_format_checkpoint_is_refused_naming_its_file(tiny_prefix, cache_dir, tmp_path, capsys,
                                                                      auto_detect):
    legacy = tmp_path / "megatron_ckpt"
    (legacy / "iter_0000010" / "mp_rank_00").mkdir(parents=True)
    (legacy / "iter_0000010" / "mp_rank_00" / "model_optim_rng.pt").write_bytes(b"not ours")
    (legacy / "latest_checkpointed_iteration.txt").write_text("10")
    listing = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    argv = argv_for(tiny_config(tiny_prefix, cache_dir, train_iters=1, num_layers=1, hidden_size=16))
    code, lines = run_main([*argv, "--load", str(legacy), *auto_detect], capsys)
    assert code != 0 and len(lines) == 1, lines
    assert "model_optim_rng.pt" in lines[0] and "--ckpt-format torch" in lines[0]
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == listing
