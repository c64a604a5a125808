"""A checkpoint written before the model-family redesign loads, and trains on, after it.

`data_test/checkpoints_before_redesign/` holds a tiny GPT's and a tiny T5's checkpoint at iteration 2,
written by the code of commit 061a93c, and the losses those runs logged for iterations 1-4 (its README
says how they were made). Resuming each with today's code must log the same losses for iterations 3
and 4: same parameter names, same optimiser state, same data position, same arithmetic.
"""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest
from trainer_testing import t5_config, tiny_config

from trainer.train import train

BEFORE = "checkpoints_before_redesign"
RESUMED_AT, LAST = 2, 4
# The same kernels in the same order give the same losses on the machine that wrote them; another CPU's
# GEMM kernels (another vector width) may round differently, by ~1e-7 relative per step, amplified by
# two AdamW steps: 1e-5 relative leaves room for that and no more (a wrong tensor moves the loss by >1e-2).
RTOL = 1e-5


def _recorded(data_test, family: str) -> list[float]:
    return json.loads((data_test / BEFORE / "losses_before.json").read_text())[family]["losses"]


def _copy(data_test, family: str, tmp_path):
    target = tmp_path / family
    shutil.copytree(data_test / BEFORE / family, target)
    return str(target)


def _resumed_losses(config) -> list[float]:
    # Those runs (warm-up 2, decay 20 steps, cosine, the default then) ran step i at the rate of i steps; today's
    # schedule is Megatron's, step i at the rate of the i - 1 steps before it, and a checkpoint without the
    # schedule's state resumes it from the steps taken. The same rates for steps 3 and 4 therefore come from the
    # same schedule one step earlier: warm-up 1, decay 19. (Before Megatron's offset this test resumed with the
    # runs' own flags.)
    shifted = dataclasses.replace(config.optimizer, lr_decay_style="cosine",
                                  lr_warmup_iters=config.optimizer.lr_warmup_iters - 1,
                                  lr_decay_iters=config.optimizer.lr_decay_iters - 1)
    config = dataclasses.replace(config, optimizer=shifted,
                                 checkpoint=dataclasses.replace(config.checkpoint, save=None))
    return train(config).losses


@pytest.mark.timeout(300)
def test_a_gpt_checkpoint_from_before_resumes_with_the_same_losses(data_test, tiny_prefix, tmp_path):
    config = tiny_config(tiny_prefix, str(tmp_path / "cache"), train_iters=LAST, num_layers=2,
                         load=_copy(data_test, "gpt", tmp_path))
    assert _resumed_losses(config) == pytest.approx(_recorded(data_test, "gpt")[RESUMED_AT:], rel=RTOL)


@pytest.mark.timeout(300)
def test_a_t5_checkpoint_from_before_resumes_with_the_same_losses(data_test, sentence_prefix, tmp_path):
    config = t5_config(sentence_prefix, data_test, str(tmp_path / "cache"), train_iters=LAST,
                       load=_copy(data_test, "t5", tmp_path))
    assert _resumed_losses(config) == pytest.approx(_recorded(data_test, "t5")[RESUMED_AT:], rel=RTOL)
