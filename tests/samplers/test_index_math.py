"""Epochs, sample counts, final-epoch rule and dtypes are exact at their boundaries."""

from __future__ import annotations

import numpy as np
import pytest

from samplers.gpt.indices import GPTIndexSpec, build_gpt_indices, plan_epochs
from samplers.errors import EmptySplitError
from samplers.indices import (
    MID_LEVEL_DATASET_SURPLUS,
    SEPARATE_FINAL_EPOCH_THRESHOLD,
    blend_sizes,
    build_document_index,
    build_shuffle_index,
    dataset_id_dtype,
    final_epoch_split,
    num_epochs,
    num_samples_in_epochs,
    sample_index_dtype,
    sequence_id_dtype,
    shuffle_index_dtype,
)

INT32_MAX = 2**31 - 1


def test_epochs_are_the_smallest_that_hold_the_samples_plus_the_extra_token():
    # 10 tokens per epoch, samples of 3 (+1): 3 samples need exactly 10 tokens.
    assert num_epochs(10, 3, 3, 1) == 1
    assert num_epochs(10, 4, 3, 1) == 2
    assert num_epochs(10, 3, 3, 0) == 1
    assert num_epochs(10, 0, 3, 1) == 1
    assert num_epochs(10, None, 3, 1) == 1
    assert num_epochs(1, 1000, 1, 1) == 1001


def test_sample_count_with_a_partial_last_sample_is_exact_where_megatron_is_off_by_one():
    # MEGATRON_FORMAT.md: T = 1,024,000,002, L = 2048, one epoch: Megatron's float ceil gives 500000.
    assert num_samples_in_epochs(1_024_000_002, 2048, 1, drop_last_partial_sample=False) == 500_001
    assert num_samples_in_epochs(1_024_000_002, 2048, 1, drop_last_partial_sample=True) == 500_000
    assert num_samples_in_epochs(2049, 2048, 1, drop_last_partial_sample=False) == 1


def test_final_epoch_is_separate_below_the_threshold():
    # T = 101, L = 10, extra 1: 10 samples per epoch; 2 epochs hold 20.
    per_epoch = 10
    limit = int(SEPARATE_FINAL_EPOCH_THRESHOLD * per_epoch)  # 8
    assert final_epoch_split(101, 2, 10 + limit - 1, 10, 1) == (True, 10)
    assert final_epoch_split(101, 2, 10 + limit, 10, 1) == (False, 10)
    assert final_epoch_split(101, 1, 5, 10, 1) == (False, 0)
    assert final_epoch_split(101, 2, 11, 10, 1, threshold=0.0) == (False, 10)


def test_dtype_bounds():
    assert sample_index_dtype(INT32_MAX) == np.int32
    assert sample_index_dtype(INT32_MAX + 1) == np.int64
    assert shuffle_index_dtype(2**32 - 3) == np.uint32
    assert shuffle_index_dtype(2**32 - 2) == np.int64
    assert sequence_id_dtype(INT32_MAX + 1) == np.int32
    assert sequence_id_dtype(INT32_MAX + 2) == np.int64
    # No cliff at 255 or 32767 datasets.
    assert dataset_id_dtype(2) == np.int16
    assert dataset_id_dtype(32768) == np.int16
    assert dataset_id_dtype(32769) == np.int32


def test_member_sizes_follow_megatrons_surplus_rule():
    assert blend_sizes([0.7, 0.3], 3000) == [2100, 900]
    assert blend_sizes([0.7, 0.3], 3000, MID_LEVEL_DATASET_SURPLUS) == [2111, 905]
    assert blend_sizes([1.0, 0.0], 10, MID_LEVEL_DATASET_SURPLUS) == [11, 0]


def test_document_index_keeps_the_final_epoch_apart():
    ids = np.arange(5, 12, dtype=np.int32)
    index = build_document_index(ids, 3, True, np.random.RandomState(0))
    assert index.dtype == np.int32
    np.testing.assert_array_equal(np.sort(index[:14]), np.sort(np.tile(ids, 2)))
    np.testing.assert_array_equal(np.sort(index[14:]), ids)


def test_shuffle_index_keeps_the_final_epoch_samples_last():
    index = build_shuffle_index(6, 10, np.random.RandomState(0))
    assert index.dtype == np.uint32
    assert sorted(index[:6]) == list(range(6)) and sorted(index[6:]) == list(range(6, 10))


def test_document_index_draws_exactly_megatrons_stream():
    # Megatron: ids repeated per epoch (as int32), one RandomState.shuffle of the whole array.
    expected = np.tile(np.arange(3, 9, dtype=np.int32), 2)
    np.random.RandomState(7).shuffle(expected)
    np.testing.assert_array_equal(build_document_index(np.arange(3, 9, dtype=np.int32), 2, False, np.random.RandomState(7)), expected)


def test_lengths_near_two_to_the_31_count_tokens_in_int64():
    lengths = np.full(3, INT32_MAX, dtype=np.int32)
    spec = GPTIndexSpec(begin=0, end=3, num_samples=7000, sequence_length=2**20, random_seed=1)
    plan = plan_epochs(lengths, spec)
    assert plan.num_tokens_per_epoch == 3 * INT32_MAX  # 6.4e9: would wrap around in int32
    assert (plan.num_epochs, plan.separate_final_epoch, plan.num_samples_before_final_epoch) == (2, True, 6143)
    arrays = build_gpt_indices(lengths, GPTIndexSpec(begin=1, end=3, num_samples=None, sequence_length=2**20, random_seed=1))
    assert len(arrays["sample_index"]) - 1 == (2 * INT32_MAX - 1) // 2**20
    assert arrays["sample_index"].dtype == np.int32
    assert arrays["sample_index"][:, 1].max() < INT32_MAX


def test_split_without_tokens_cannot_give_samples():
    lengths = np.array([3, 0, 0, 4], np.int32)
    with pytest.raises(EmptySplitError, match="hold no tokens"):
        plan_epochs(lengths, GPTIndexSpec(begin=1, end=3, num_samples=5, sequence_length=2, random_seed=1))
