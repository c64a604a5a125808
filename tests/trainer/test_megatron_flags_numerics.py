"""Megatron's loss and numerics flags (issue 29, section 3):

- the NaN/Inf check is on by default, as Megatron's --check-for-nan-in-loss-and-grad: a diverged run stops with
  one line naming the iteration and the rank; ``--no-check-for-nan-in-loss-and-grad`` runs on, skipping (and
  counting) such steps;
- the step's figures (loss, gradient norm) are read on the host once: after the clipping and the optimizer's
  step are queued where a non-finite value stops the run, before the optimizer's step where one is skipped (fp16,
  ``--loss-scale``, ``--no-check-for-nan-in-loss-and-grad``); clipping is computed on the device;
- ``--accumulate-allreduce-grads-in-fp32`` is what we always do: the same losses;
- ``--disable-bf16-reduced-precision-matmul`` sets torch's process-wide CUDA switch, as Megatron does.
"""

from __future__ import annotations

import math

import pytest
import torch
from trainer_testing import argv_for, tiny_config

import trainer.train as train_module
from trainer.cli.train import main
from trainer.errors import NonFiniteError
from trainer.optim.grads import clip_factor
from trainer.train import train

# A learning rate that makes the weights overflow float32 after one AdamW step (no clipping).
DIVERGING_LR = "1e30"


def diverging_argv(tiny_prefix, cache_dir) -> list[str]:
    argv = argv_for(tiny_config(tiny_prefix, cache_dir, train_iters=3, num_layers=1, hidden_size=16))
    return [*argv, "--lr", DIVERGING_LR, "--min-lr", "0", "--lr-warmup-iters", "0", "--clip-grad", "0"]


@pytest.mark.timeout(300)
def test_a_non_finite_loss_stops_the_run_in_one_line_naming_iteration_and_rank(tiny_prefix, cache_dir, capsys):
    assert main(diverging_argv(tiny_prefix, cache_dir)) != 0
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1, lines
    assert "iteration 2:" in lines[0] and "rank 0" in lines[0] and "--no-check-for-nan-in-loss-and-grad" in lines[0]
    assert "Traceback" not in lines[0]


@pytest.mark.timeout(300)
def test_without_the_check_the_run_goes_on_skipping_the_steps(tiny_prefix, cache_dir):
    config = tiny_config(tiny_prefix, cache_dir, train_iters=3, num_layers=1, hidden_size=16)
    config.optimizer.lr, config.optimizer.min_lr, config.optimizer.lr_warmup_iters = float(DIVERGING_LR), 0.0, 0
    config.optimizer.clip_grad = 0.0
    with pytest.raises(NonFiniteError, match="iteration 2"):
        train(config)
    config.precision.no_check_for_nan_in_loss_and_grad = True
    result = train(config)
    assert result.iteration == 3 and not all(math.isfinite(loss) for loss in result.losses)


@pytest.mark.timeout(300)
def test_accumulate_allreduce_grads_in_fp32_is_what_we_do(tiny_prefix, cache_dir):
    config = tiny_config(tiny_prefix, cache_dir, train_iters=2, num_layers=1, hidden_size=16)
    plain = train(config).losses
    config.precision.accumulate_allreduce_grads_in_fp32 = True
    assert train(config).losses == plain


@pytest.mark.timeout(300)
def test_disable_bf16_reduced_precision_matmul_sets_the_backend_switch(tiny_prefix, cache_dir):
    matmul = torch.backends.cuda.matmul
    before = matmul.allow_bf16_reduced_precision_reduction
    try:
        matmul.allow_bf16_reduced_precision_reduction = True
        config = tiny_config(tiny_prefix, cache_dir, train_iters=1, num_layers=1, hidden_size=16)
        config.precision.disable_bf16_reduced_precision_matmul = True
        train(config)
        assert matmul.allow_bf16_reduced_precision_reduction is False
    finally:
        matmul.allow_bf16_reduced_precision_reduction = before


def test_clip_factor_is_megatrons_coefficient_computed_beside_the_norm():
    norm = torch.tensor(4.0, dtype=torch.float64)
    assert clip_factor(norm, 2.0).item() == 2.0 / (4.0 + 1.0e-6)
    assert clip_factor(norm, 8.0).item() == 1.0  # capped at 1: a small norm is not scaled up
    assert clip_factor(norm, 0.0).item() == 1.0  # --clip-grad 0: off
    assert clip_factor(norm, 2.0).dtype == torch.float64
    # A non-finite norm leaves the gradients as they are: the step is skipped, or the run stops naming the
    # ranks whose own gradients hold the value (a NaN factor would spread it to every gradient).
    for value in (math.nan, math.inf):
        assert clip_factor(torch.tensor(value, dtype=torch.float64), 2.0).item() == 1.0


def step_events(monkeypatch, config) -> list[str]:
    """The order of the optimizer's steps and the host reads of the step's figures over a run of ``config``."""
    events: list[str] = []
    queue_host_read = train_module.queue_host_read

    def recorded_queue(values):
        read = queue_host_read(values)

        def recorded_read():
            events.append("read")
            return read()

        return recorded_read

    adamw_step = torch.optim.AdamW.step

    def recorded_step(self, *args, **kwargs):
        events.append("step")
        return adamw_step(self, *args, **kwargs)

    monkeypatch.setattr(train_module, "queue_host_read", recorded_queue)
    monkeypatch.setattr(torch.optim.AdamW, "step", recorded_step)
    train(config)
    return events


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16", "loss-scale", "no-check"])
def test_the_figures_are_read_after_the_step_is_queued_unless_the_host_decides_on_it(
        precision, monkeypatch, tiny_prefix, cache_dir):
    config = tiny_config(tiny_prefix, cache_dir, train_iters=2, num_layers=1, hidden_size=16)
    config.precision.bf16 = precision == "bf16"
    config.precision.fp16 = precision == "fp16"
    config.precision.loss_scale = 1024.0 if precision == "loss-scale" else None
    config.precision.no_check_for_nan_in_loss_and_grad = precision == "no-check"
    host_decides = precision in ("fp16", "loss-scale", "no-check")
    assert step_events(monkeypatch, config) == (["read", "step"] if host_decides else ["step", "read"]) * 2
