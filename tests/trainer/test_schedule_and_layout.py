"""Pure pieces: the learning-rate schedule, fp16 loss scaling, vocabulary padding, batch/layout rules."""

import math

import pytest
from trainer_testing import tiny_config

from trainer.config import OptimizerConfig, PrecisionConfig, TrainingConfig
from trainer.errors import TrainConfigError
from trainer.models.gpt.training import flops_per_token
from trainer.models.gpt.model import GPTShape
from trainer.optim.optimizer import LossScaler
from trainer.models import model_spec
from trainer.parallel.dims import pad_vocab_size, resolve_parallel_dims


def lr_after(style, steps, **kwargs):
    """The learning rate of the step after ``steps`` taken (batch 1: a step is a sample)."""
    config = OptimizerConfig(lr=1.0, min_lr=0.1, lr_decay_style=style, lr_warmup_iters=10, **kwargs)
    scheduler = config.scheduler(TrainingConfig(train_iters=110), global_batch_size=1)
    scheduler.step(steps)
    return scheduler.lr()


def test_warmup_is_linear_from_zero():
    # Megatron's: step 1 runs at the rate of 0 samples (the warm-up's start), step 11 at the peak. (This test
    # used to expect 0.1 at step 1: the old schedule ran one step ahead of Megatron's.)
    assert [lr_after("cosine", taken) for taken in (0, 4, 10)] == pytest.approx([0.0, 0.4, 1.0])


@pytest.mark.parametrize(("style", "midpoint"), [("linear", 0.55), ("cosine", 0.55), ("constant", 1.0)])
def test_decay_styles_reach_min_lr_at_decay_iters(style, midpoint):
    assert lr_after(style, 60) == pytest.approx(midpoint)
    assert lr_after(style, 110) == pytest.approx(1.0 if style == "constant" else 0.1)
    assert lr_after(style, 500) == pytest.approx(1.0 if style == "constant" else 0.1)


def test_warmup_fraction_is_of_the_decay_samples_unrounded():
    config = OptimizerConfig(lr=1.0, lr_warmup_fraction=0.1, lr_decay_iters=205)
    scheduler = config.scheduler(TrainingConfig(train_iters=50), global_batch_size=4)
    assert scheduler.lr_warmup_steps == pytest.approx(82.0)


def test_loss_scale_halves_after_hysteresis_and_doubles_after_window():
    scaler = LossScaler(PrecisionConfig(fp16=True, initial_loss_scale=1024, hysteresis=2, loss_scale_window=3))
    scaler.update(found_inf=True)
    assert scaler.scale == 1024
    scaler.update(found_inf=True)
    assert scaler.scale == 512
    for _ in range(3):
        scaler.update(found_inf=False)
    assert scaler.scale == 1024
    restored = LossScaler(PrecisionConfig(fp16=True))
    restored.load_state_dict(scaler.state_dict())
    assert (restored.scale, restored.clean_steps, restored.hysteresis_left) == (1024, 0, 2)


def test_loss_scale_never_drops_below_minimum():
    scaler = LossScaler(PrecisionConfig(fp16=True, initial_loss_scale=4, hysteresis=1, min_loss_scale=2))
    for _ in range(5):
        scaler.update(found_inf=True)
    assert scaler.scale == 2


def test_vocab_padding_matches_megatron():
    assert pad_vocab_size(50257, 128, 1) == 50304
    assert pad_vocab_size(50257, 128, 2) == 50432
    assert pad_vocab_size(256, 64, 2) == 256


def test_layout_derives_accumulation_from_global_batch():
    config = tiny_config("unused", "unused", tp=2)
    dims = resolve_parallel_dims(config, 4, model_spec(config.model.model).layout_rules)
    assert (dims.pp, dims.dp, dims.tp, dims.num_microbatches) == (1, 2, 2, 2)
    assert dims.global_batch_size == 8


def test_interleaved_schedule_needs_layers_per_chunk_to_divide():
    config = tiny_config("unused", "unused", pp=2, schedule="interleaved", virtual_layers=3)
    with pytest.raises(TrainConfigError, match="num_layers_per_virtual_pipeline_stage"):
        resolve_parallel_dims(config, 2, model_spec(config.model.model).layout_rules)


def test_gpt2_small_flops_match_the_6n_rule():
    shape = GPTShape(num_layers=12, hidden_size=768, num_attention_heads=12, ffn_hidden_size=3072,
                     max_position_embeddings=1024, padded_vocab_size=50304)
    non_embedding_params = 12 * 12 * 768 * 768
    attention = 3 * 12 * 4 * 1024 * 768
    expected = 6 * (non_embedding_params + 768 * 50304) + attention
    assert math.isclose(flops_per_token(shape, 1024), expected)
