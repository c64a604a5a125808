"""bf16, fp16 with loss scaling, and activation checkpointing in one process."""

import dataclasses
import math

from trainer_testing import result_record, tiny_config

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


def test_fp16_skips_overflowing_steps_and_backs_off(tiny_prefix, cache_dir):
    # A scale of 2**22 overflows this model's fp16 gradients (2**19 is the first that fits): the first
    # steps are skipped, each halving the scale, then training goes on.
    result = run(tiny_config(tiny_prefix, cache_dir, train_iters=FP16_STEPS),
                 precision={"fp16": True, "hysteresis": 1, "initial_loss_scale": 2.0**22})
    assert not math.isfinite(result["grad_norms"][0])
    assert all(math.isfinite(loss) for loss in result["losses"])
    assert math.isfinite(result["grad_norms"][-1])
