"""Megatron's loss and numerics flags (issue 29, section 3):

- the NaN/Inf check is on by default, as Megatron's --check-for-nan-in-loss-and-grad: a diverged run stops with
  one line naming the iteration and the rank; ``--no-check-for-nan-in-loss-and-grad`` runs on, skipping (and
  counting) such steps;
- the step's figures (loss, gradient norm) are read on the host once: where a non-finite value stops the run,
  during the next step (after its forward and backward are queued, before its update), or at the step's own
  end where an evaluation, a save or the run's end follows it; before the optimizer's step where one is skipped
  (fp16, ``--loss-scale``, ``--no-check-for-nan-in-loss-and-grad``); clipping is computed on the device; a run
  that stops at a step's figures read later keeps that step's weights and counts, as if it had read them at once;
  each step's time runs from its batch's request to the next one's (or, read at once, to its figures): the
  times tile the run whenever the figures are read;
- ``--accumulate-allreduce-grads-in-fp32`` is what we always do: the same losses;
- ``--disable-bf16-reduced-precision-matmul`` sets torch's process-wide CUDA switch, as Megatron does.
"""

from __future__ import annotations

import json
import math
import time
import types

import pytest
import torch
from torch import nn
from trainer_testing import argv_for, tiny_config

import trainer.train as train_module
from trainer.cli.train import main
from trainer.errors import NonFiniteError
from trainer.checkpoint.early_exit import EarlyExit
from trainer.optim.grads import clip_factor, global_grad_norm
from trainer.parallel.runner import ParallelModel
from trainer.train import train

# What a metrics record holds that depends on the clock.
CLOCK_KEYS = frozenset({"ms_per_iteration", "data_ms_per_iteration", "tokens_per_second", "tflops_per_device", "mfu"})
# A finite float32 gradient whose square overflows float32 (max ~3.4e38): the per-tensor norm is infinite.
FLOAT32_NORM_OVERFLOW = 1.0e20
# tiny_config's global batch (samples a step).
TINY_GLOBAL_BATCH = 8
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
    """The order of the training forward-backward passes ("run"), the optimizer's steps and the host reads of the
    steps' figures over a run of ``config``."""
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

    model_run = ParallelModel.run

    def recorded_run(self, microbatches, train):
        if train:
            events.append("run")
        return model_run(self, microbatches, train)

    monkeypatch.setattr(train_module, "queue_host_read", recorded_queue)
    monkeypatch.setattr(torch.optim.AdamW, "step", recorded_step)
    monkeypatch.setattr(ParallelModel, "run", recorded_run)
    train(config)
    monkeypatch.undo()
    return events


@pytest.mark.parametrize("mode", ["fp32", "bf16", "fp16", "loss-scale", "no-check", "timed"])
def test_a_steps_figures_are_read_during_the_next_step_unless_the_host_decides_on_it(
        mode, monkeypatch, tiny_prefix, cache_dir):
    config = tiny_config(tiny_prefix, cache_dir, train_iters=3, num_layers=1, hidden_size=16)
    config.precision.bf16 = mode == "bf16"
    config.precision.fp16 = mode == "fp16"
    config.precision.loss_scale = 1024.0 if mode == "loss-scale" else None
    config.precision.no_check_for_nan_in_loss_and_grad = mode == "no-check"
    config.logging.timing_log_level = 1 if mode == "timed" else 0
    if mode in ("fp16", "loss-scale", "no-check"):  # read first: an overflowing step is skipped
        assert step_events(monkeypatch, config) == ["run", "read", "step"] * 3
    elif mode == "timed":  # each phase waits for the device: the figures are read at the step's end
        assert step_events(monkeypatch, config) == ["run", "step", "read"] * 3
    else:  # steps 1 and 2 are read during the next step, the last at its own end
        assert step_events(monkeypatch, config) == ["run", "step", "run", "read", "step", "run", "read", "step",
                                                    "read"]


@pytest.mark.timeout(300)
def test_a_step_that_evaluates_or_saves_reads_its_figures_at_its_own_end(monkeypatch, tiny_prefix, cache_dir,
                                                                        tmp_path):
    config = tiny_config(tiny_prefix, cache_dir, train_iters=4, num_layers=1, hidden_size=16, eval_iters=1,
                         save=str(tmp_path / "run"), save_interval=3)
    config.logging.eval_interval = 2
    assert step_events(monkeypatch, config) == ["run", "step", "run", "read", "step", "read",  # 2 evaluates
                                                "run", "step", "read",  # 3 saves
                                                "run", "step", "read"]  # 4 is the last


def _records_but_times(path) -> list[dict]:
    """The metrics records of ``path``, without what depends on the clock."""
    records = [json.loads(line) for line in path.read_text().splitlines()]
    return [{key: value for key, value in record.items() if key not in CLOCK_KEYS} for record in records]


@pytest.mark.timeout(300)
def test_reading_the_figures_a_step_later_changes_no_figure_and_no_log(tiny_prefix, cache_dir, tmp_path,
                                                                      monkeypatch):
    def run(name: str):
        config = tiny_config(tiny_prefix, cache_dir, train_iters=6, num_layers=1, hidden_size=16,
                             metrics_file=str(tmp_path / f"{name}.jsonl"))
        config.logging.log_interval = 2
        return train(config), _records_but_times(tmp_path / f"{name}.jsonl")

    later, later_records = run("later")
    monkeypatch.setattr(train_module._Run, "_reads_later", lambda self, iteration: False)
    at_once, at_once_records = run("at_once")
    assert later.losses == at_once.losses and later.grad_norms == at_once.grad_norms
    assert later_records == at_once_records
    assert [record["iteration"] for record in later_records if "loss" in record] == [2, 4, 6]


@pytest.mark.parametrize("reads", ["later", "at_once"])
def test_each_step_is_timed_from_its_batch_to_the_next_steps_batch(tiny_prefix, cache_dir, tmp_path, monkeypatch,
                                                                   reads):
    """On a clock that moves only in the forward-backward (1 s) and the optimizer's step (0.25 s), as a CPU runs
    them, every step takes 1.25 s, the first and the last too: a step read during the next one ends where the
    next one asks for its batch, so neither the next forward-backward nor a read shifts time between steps."""
    forward_backward_s, optimizer_s = 1.0, 0.25  # binary fractions: the sums are exact
    clock = [0.0]
    monkeypatch.setattr(train_module, "time", types.SimpleNamespace(perf_counter=lambda: clock[0],
                                                                    monotonic=time.monotonic))
    model_run, adamw_step = ParallelModel.run, torch.optim.AdamW.step

    def timed_run(self, microbatches, train):
        clock[0] += forward_backward_s if train else 0.0
        return model_run(self, microbatches, train)

    def timed_step(self, *args, **kwargs):
        clock[0] += optimizer_s
        return adamw_step(self, *args, **kwargs)

    monkeypatch.setattr(ParallelModel, "run", timed_run)
    monkeypatch.setattr(torch.optim.AdamW, "step", timed_step)
    if reads == "at_once":
        monkeypatch.setattr(train_module._Run, "_reads_later", lambda self, iteration: False)
    config = tiny_config(tiny_prefix, cache_dir, train_iters=4, num_layers=1, hidden_size=16,
                         metrics_file=str(tmp_path / "metrics.jsonl"))
    config.logging.log_interval = 1
    train(config)
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    times = [record["ms_per_iteration"] for record in records if "loss" in record]
    assert times == [1000 * (forward_backward_s + optimizer_s)] * 4


@pytest.mark.timeout(300)
def test_a_run_stopped_at_a_later_read_keeps_the_weights_and_counts_of_the_step_it_read(tiny_prefix, cache_dir,
                                                                                       tmp_path, monkeypatch):
    """An early exit due after step 3 is seen when step 3's figures are read, during step 4: the run stops there
    and saves step 3's weights and sample count; resumed, it trains on as a run that never stopped."""
    def config(name: str, load: str | None = None):
        return tiny_config(tiny_prefix, cache_dir, train_iters=5, num_layers=1, hidden_size=16,
                           save=str(tmp_path / name), load=load)

    whole = train(config("whole"))
    reason = EarlyExit.reason

    def exit_after_3(self, iteration):
        return "a test's signal" if iteration == 3 else reason(self, iteration)

    monkeypatch.setattr(EarlyExit, "reason", exit_after_3)
    stopped = train(config("stopped"))
    monkeypatch.undo()
    assert stopped.iteration == 3 and stopped.consumed_samples == 3 * TINY_GLOBAL_BATCH
    assert stopped.losses == whole.losses[:3]
    resumed = train(config("resumed", load=str(tmp_path / "stopped")))
    assert resumed.losses == whole.losses[3:]


@pytest.mark.timeout(300)
def test_a_non_finite_value_read_a_step_later_names_its_step_and_rank(tiny_prefix, cache_dir):
    config = tiny_config(tiny_prefix, cache_dir, train_iters=4, num_layers=1, hidden_size=16)
    config.optimizer.lr, config.optimizer.min_lr, config.optimizer.lr_warmup_iters = float(DIVERGING_LR), 0.0, 0
    config.optimizer.clip_grad = 0.0
    with pytest.raises(NonFiniteError, match=r"iteration 2: the loss is \S+ \(from rank 0\)"):
        train(config)


@pytest.mark.timeout(300)
def test_a_non_finite_gradient_read_a_step_later_names_the_rank_that_held_it(tiny_prefix, cache_dir, monkeypatch):
    """Step 2's gradients hold an infinity; its figures are read during step 3, whose backward has replaced the
    gradients by finite ones: the rank is still named (from step 2's own flag)."""
    model_run = ParallelModel.run
    runs = []

    def run_with_an_infinite_gradient_at_2(self, microbatches, train):
        figures = model_run(self, microbatches, train)
        if train:
            runs.append(None)
            if len(runs) == 2:
                next(p for _, p in self.named_parameters() if p.grad is not None).grad.view(-1)[0] = math.inf
        return figures

    monkeypatch.setattr(ParallelModel, "run", run_with_an_infinite_gradient_at_2)
    config = tiny_config(tiny_prefix, cache_dir, train_iters=4, num_layers=1, hidden_size=16)
    with pytest.raises(NonFiniteError, match=r"iteration 2: the gradient norm is inf \(from rank 0\)"):
        train(config)
    assert len(runs) == 3


def test_the_gradient_norm_says_whether_this_ranks_own_gradients_are_finite():
    weights = [nn.Parameter(torch.zeros(3)), nn.Parameter(torch.zeros(2, 2))]
    weights[0].grad, weights[1].grad = torch.tensor([3.0, 0.0, 0.0]), torch.tensor([[4.0, 0.0], [0.0, 0.0]])
    norm = global_grad_norm(weights, None)
    assert norm.total.item() == 5.0 and norm.local_finite.item() is True
    for value in (math.nan, math.inf, FLOAT32_NORM_OVERFLOW):
        weights[1].grad[1, 1] = value
        assert global_grad_norm(weights, None).local_finite.item() is False, value
