"""bf16, fp16 with loss scaling, and activation checkpointing in one process."""

import dataclasses
import json
import math

import pytest

from trainer_testing import lr_after_steps, result_record, tiny_config


STEPS = 3
FP16_STEPS = 6


def run(config, **sections):
    for name, changes in sections.items():
        config = dataclasses.replace(config, **{name: dataclasses.replace(getattr(config, name), **changes)})
    return result_record(config)


def test_activation_checkpointing_gives_the_same_losses(reference, tiny_prefix, cache_dir):
    result = run(tiny_config(tiny_prefix, cache_dir, train_iters=STEPS), training={"checkpoint_activations": True})
    assert result["losses"] == reference["losses"][:STEPS]


def test_bf16_trains_close_to_fp32(reference, tiny_prefix, cache_dir):
    result = run(tiny_config(tiny_prefix, cache_dir, train_iters=STEPS), precision={"bf16": True})
    assert all(abs(a - b) < 0.05 for a, b in zip(result["losses"], reference["losses"]))


def test_fp16_on_a_cpu_computes_in_fp32_with_exact_loss_scaling(reference, tiny_prefix, cache_dir, caplog):
    # A power-of-2 loss scale is undone exactly, so the losses are fp32's to the bit.
    result = run(tiny_config(tiny_prefix, cache_dir, train_iters=STEPS), precision={"fp16": True})
    assert result["losses"] == reference["losses"][:STEPS]
    assert "--fp16 on a CPU: computing in float32" in caplog.text


def test_fp16_skips_overflowing_steps_backs_off_and_holds_the_learning_rate(tiny_prefix, cache_dir, tmp_path):
    # The gradient norm is a sum of squares in float32 (max ~2**128): 2**66 times this model's gradients
    # overflows it, so the first steps are skipped, each halving the scale, then training goes on. As
    # Megatron, a skipped step does not advance the learning-rate schedule.
    metrics = tmp_path / "metrics.jsonl"
    config = tiny_config(tiny_prefix, cache_dir, train_iters=FP16_STEPS, metrics_file=str(metrics))
    result = run(config, precision={"fp16": True, "hysteresis": 1, "initial_loss_scale": 2.0**66},
                 logging={"log_interval": 1})
    assert not math.isfinite(result["grad_norms"][0])
    assert all(math.isfinite(loss) for loss in result["losses"])
    assert math.isfinite(result["grad_norms"][-1])
    lines = [json.loads(line) for line in metrics.read_text().splitlines()]
    steps = [line for line in lines if "lr" in line]
    skipped = sum(not math.isfinite(norm) for norm in result["grad_norms"])
    assert 0 < skipped < FP16_STEPS
    # warm-up is 2 steps: every skipped step repeats step 1's rate (0, the warm-up's start, as Megatron); the
    # taken ones then follow the schedule
    expected = [lr_after_steps(config, 0)] * (skipped + 1) + [lr_after_steps(config, k)
                                                              for k in range(1, FP16_STEPS - skipped)]
    assert [s["lr"] for s in steps] == pytest.approx(expected)


def test_a_static_loss_scale_never_changes(tiny_prefix, cache_dir, tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    result = run(tiny_config(tiny_prefix, cache_dir, train_iters=STEPS, metrics_file=str(metrics)),
                 precision={"fp16": True, "loss_scale": 2.0**130}, logging={"log_interval": 1})
    assert not any(math.isfinite(norm) for norm in result["grad_norms"]), "every step overflows at 2**130"
    steps = [json.loads(line) for line in metrics.read_text().splitlines() if '"lr"' in line]
    assert {s["loss_scale"] for s in steps} == {2.0**130}
    assert [s["skipped_iterations"] for s in steps] == [1, 2, 3]
