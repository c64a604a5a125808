"""Validation and test samples follow Megatron: how many are built, which each evaluation reads, and where a
resumed run's validation continues; a split too small for its count names the flags behind it."""

from __future__ import annotations

import dataclasses

import pytest
from trainer_testing import tiny_config

import trainer.train as train_module
from samplers.run_length import RunLength
from samplers.splits import DEFAULT_SPLIT
from trainer.errors import TrainConfigError
from trainer.train import train

GLOBAL_BATCH = 8  # tiny_config's global batch size


def test_split_sizes_are_megatrons():
    run = RunLength(train_iters=10, global_batch_size=8, eval_interval=5, eval_iters=2)
    # valid: eval_iters x (train_iters // eval_interval + 1) x global batch; test: eval_iters x global batch.
    assert run.sizes() == (80, 2 * 3 * 8, 2 * 8)
    assert run.num_evaluations == 3
    assert RunLength(train_iters=7, global_batch_size=4, eval_interval=1000, eval_iters=0).sizes() == (28, 0, 0)


def test_resumed_validation_starts_after_the_earlier_evaluations():
    run = RunLength(train_iters=100, global_batch_size=8, eval_interval=10, eval_iters=3)
    # Megatron: consumed valid samples = (iteration // eval_interval) * eval_iters * global_batch_size.
    assert [run.consumed_valid_samples(i) for i in (0, 9, 10, 25, 100)] == [0, 0, 24, 48, 240]


def record_evaluations(monkeypatch) -> list[tuple[str, int, int]]:
    """Patch the loop's batch source to log (split, first sample, split size) of every evaluation."""
    calls = []
    original = train_module.step_iterator

    def recording(dataset, consumed_samples, *args, **kwargs):
        if dataset.split != "train":
            calls.append((dataset.split, consumed_samples, len(dataset)))
        return original(dataset, consumed_samples, *args, **kwargs)

    monkeypatch.setattr(train_module, "step_iterator", recording)
    return calls


def with_evaluation(config, eval_interval: int, eval_iters: int):
    return dataclasses.replace(config, logging=dataclasses.replace(config.logging, eval_interval=eval_interval,
                                                                   eval_iters=eval_iters))


@pytest.mark.timeout(300)
def test_each_evaluation_reads_the_next_validation_samples(monkeypatch, tiny_prefix, cache_dir):
    calls = record_evaluations(monkeypatch)
    train(with_evaluation(tiny_config(tiny_prefix, cache_dir, train_iters=7), eval_interval=3, eval_iters=1))
    # Steps 3 and 6, then after training (Megatron's valid iterator); test once from its start.
    assert [(split, first) for split, first, _ in calls] == [("valid", 0), ("valid", 8), ("valid", 16), ("test", 0)]
    valid_size = RunLength(train_iters=7, global_batch_size=GLOBAL_BATCH, eval_interval=3, eval_iters=1).sizes()[1]
    assert all(size >= valid_size for split, _, size in calls if split == "valid")


@pytest.mark.timeout(300)
def test_a_resumed_run_continues_the_validation_samples(monkeypatch, tiny_prefix, cache_dir, tmp_path):
    checkpoint = str(tmp_path / "checkpoint")
    whole = train(with_evaluation(tiny_config(tiny_prefix, cache_dir, train_iters=7), eval_interval=3, eval_iters=1))
    train(with_evaluation(tiny_config(tiny_prefix, cache_dir, train_iters=4, save=checkpoint), 3, 1))
    calls = record_evaluations(monkeypatch)
    resumed = train(with_evaluation(tiny_config(tiny_prefix, cache_dir, train_iters=7, load=checkpoint), 3, 1))
    # Resumed at step 4: the evaluation at step 6 and the final one read what the whole run's did.
    assert [(split, first) for split, first, _ in calls] == [("valid", 8), ("valid", 16), ("test", 0)]
    assert resumed.eval_losses == whole.eval_losses


@pytest.mark.timeout(120)
def test_an_empty_split_names_the_flags_behind_its_sample_count(tiny_prefix, cache_dir):
    config = tiny_config(tiny_prefix, cache_dir)
    config = dataclasses.replace(config, data=dataclasses.replace(config.data, split=DEFAULT_SPLIT))
    # 969,30,1 of 232 sequences leaves the test split no sequence; OneFlow's --eval-iters 100 asks it for 800.
    with pytest.raises(TrainConfigError) as raised:
        train(with_evaluation(config, eval_interval=1000, eval_iters=100))
    message = str(raised.value)
    assert "800 samples were requested" in message
    assert "--eval-iters 100 x --global-batch-size 8 = 800" in message
    assert f"--split (now {DEFAULT_SPLIT}" in message and "--eval-iters 0" in message
    assert "\n" not in message
