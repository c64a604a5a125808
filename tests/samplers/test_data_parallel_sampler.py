"""DataParallelSampler: Megatron's pretraining order, a seeded shuffle, and resume at any point and dp size."""

from __future__ import annotations

import pytest

from samplers import DataParallelSampler


def megatron_pretraining_sampler(total, consumed, micro_batch_size, rank, dp):
    """Megatron's MegatronPretrainingSampler (drop_last=True), spelt out as the oracle."""
    batch = []
    for idx in range(consumed, total):
        batch.append(idx)
        if len(batch) == micro_batch_size * dp:
            yield batch[rank * micro_batch_size : (rank + 1) * micro_batch_size]
            batch = []


def global_stream(sampler_kwargs, dp, micro_batch_size, consumed=0):
    """Interleave every rank's micro-batches back into the global order they read."""
    ranks = [
        list(DataParallelSampler(consumed_samples=consumed, micro_batch_size=micro_batch_size,
                                 data_parallel_rank=r, data_parallel_size=dp, **sampler_kwargs))
        for r in range(dp)
    ]
    return [i for step in zip(*ranks) for batch in step for i in batch]


@pytest.mark.parametrize("total, consumed, mbs, dp", [(100, 0, 4, 2), (101, 12, 3, 4), (7, 0, 2, 3), (64, 64, 2, 2)])
def test_sequential_order_is_megatrons(total, consumed, mbs, dp):
    for rank in range(dp):
        ours = list(DataParallelSampler(total, consumed, mbs, rank, dp))
        assert ours == list(megatron_pretraining_sampler(total, consumed, mbs, rank, dp))
        assert len(DataParallelSampler(total, consumed, mbs, rank, dp)) == len(ours)


@pytest.mark.parametrize("shuffle", [False, True])
def test_resume_with_another_dp_size_continues_the_same_global_order(shuffle):
    kwargs = {"total_samples": 96, "shuffle": shuffle, "seed": 9, "num_epochs": 3}
    full = global_stream(kwargs, dp=4, micro_batch_size=2)
    assert len(full) == 96 * 3
    for consumed, dp, mbs in [(24, 2, 3), (40, 1, 4), (96, 8, 1), (100, 3, 2)]:
        resumed = global_stream(kwargs, dp=dp, micro_batch_size=mbs, consumed=consumed)
        assert resumed == full[consumed : consumed + len(resumed)]
        assert len(full) - consumed - len(resumed) < dp * mbs  # only an incomplete last step is dropped


def test_shuffle_is_a_seeded_permutation_per_epoch():
    def epochs(seed):
        stream = global_stream({"total_samples": 50, "shuffle": True, "seed": seed, "num_epochs": 2}, 1, 5)
        return stream[:50], stream[50:]

    first, second = epochs(1)
    assert sorted(first) == sorted(second) == list(range(50))
    assert first != second and first != list(range(50))
    assert epochs(1) == (first, second)
    assert epochs(2)[0] != first


def test_state_round_trip():
    sampler = DataParallelSampler(40, 0, 2, 0, 2, shuffle=True, seed=3)
    restored = DataParallelSampler(40, 0, 2, 1, 4, shuffle=True, seed=0)
    restored.load_state_dict({"consumed_samples": 8, "seed": 3})
    assert restored.state_dict() == {"consumed_samples": 8, "seed": 3}
    assert next(iter(restored)) == sampler.global_order(10, 12).tolist()


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"data_parallel_rank": 2}, "data_parallel_rank"),
        ({"micro_batch_size": 0}, "micro_batch_size"),
        ({"consumed_samples": 11}, "consumed_samples"),
    ],
)
def test_bad_arguments_name_themselves(kwargs, field):
    arguments = {"total_samples": 10, "consumed_samples": 0, "micro_batch_size": 2, "data_parallel_rank": 0,
                 "data_parallel_size": 2, **kwargs}
    with pytest.raises(ValueError, match=field):
        DataParallelSampler(**arguments)


def test_dataloader_batches_after_resume_equal_the_uninterrupted_ones(positional_dataset, tmp_path):
    import torch

    from samplers import GPTDatasetConfig, build_gpt_datasets

    prefix = positional_dataset(list(range(1, 60)))
    config = GPTDatasetConfig(sequence_length=16, blend=([prefix], None), split="1,0,0", path_to_cache=str(tmp_path))
    train = build_gpt_datasets(config)[0]

    def batches(consumed, dp_rank, dp):
        sampler = DataParallelSampler(len(train), consumed, 2, dp_rank, dp, shuffle=True, seed=4)
        return [b["tokens"] for b in torch.utils.data.DataLoader(train, batch_sampler=sampler)]

    uninterrupted = batches(0, 0, 1)
    resumed = batches(6, 0, 1)  # after 3 steps of 2 samples
    assert all(torch.equal(a, b) for a, b in zip(uninterrupted[3:], resumed))
    assert len(resumed) == len(uninterrupted) - 3
