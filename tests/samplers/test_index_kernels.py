"""The numba kernels equal their numpy twins on random inputs, and their outputs mean what they say."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from samplers import kernels, reference
from samplers.indices import (
    build_blending_indices,
    build_exhaustive_blending_indices,
    build_sample_index,
    num_samples_in_epochs,
)

lengths_strategy = st.lists(st.integers(0, 40), min_size=1, max_size=60).filter(lambda x: sum(x) > 1)


def kernel_sample_index(lengths, document_index, sequence_length, extra, drop_last):
    total = int(lengths[document_index].sum())
    return build_sample_index(lengths, document_index, total, sequence_length, extra, drop_last)


@settings(max_examples=300, deadline=None)
@given(
    lengths=lengths_strategy,
    epochs=st.integers(1, 3),
    sequence_length=st.integers(1, 50),
    extra=st.integers(0, 1),
    drop_last=st.booleans(),
    seed=st.integers(0, 2**31),
)
def test_sample_index_kernel_equals_reference(lengths, epochs, sequence_length, extra, drop_last, seed):
    lengths = np.array(lengths, np.int32)
    document_index = np.tile(np.arange(len(lengths), dtype=np.int32), epochs)
    np.random.RandomState(seed).shuffle(document_index)
    ours = kernel_sample_index(lengths, document_index, sequence_length, extra, drop_last)
    expected = reference.sample_index_reference(lengths, document_index, sequence_length, extra, len(ours) - 1)
    np.testing.assert_array_equal(ours, expected)


@settings(max_examples=200, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 40), min_size=1, max_size=60).filter(lambda x: sum(x) > 1),
    sequence_length=st.integers(1, 50),
    extra=st.integers(0, 1),
    drop_last=st.booleans(),
)
def test_every_sample_reads_exactly_its_tokens_inside_its_sequences(lengths, sequence_length, extra, drop_last):
    lengths = np.array(lengths, np.int32)
    document_index = np.arange(len(lengths), dtype=np.int32)[::-1].copy()
    index = kernel_sample_index(lengths, document_index, sequence_length, extra, drop_last)
    starts = np.concatenate(([0], np.cumsum(lengths[document_index], dtype=np.int64)))
    total = int(starts[-1])
    assert len(index) - 1 == num_samples_in_epochs(total, sequence_length, extra, drop_last)
    positions, offsets = index[:, 0], index[:, 1].astype(np.int64)
    assert np.all((0 <= offsets) & (offsets <= lengths[document_index[positions]]))
    global_start = starts[positions] + offsets
    num_full = (total - extra) // sequence_length
    # Full samples start L tokens apart; each reads L + extra tokens that exist.
    assert np.all(np.diff(global_start)[:num_full] == sequence_length)
    assert global_start[num_full] + extra <= total
    if len(index) - 1 > num_full:
        # The partial last sample reads to the end of the tokens and no further.
        assert global_start[-1] + extra == total


def test_exact_fit_ends_inside_the_last_sequence():
    # 2 samples of 4 (+1) tokens need exactly 9 tokens: the last row points at the final token.
    index = kernel_sample_index(np.array([4, 5], np.int32), np.array([0, 1], np.int32), 4, 1, True)
    assert index.tolist() == [[0, 0], [1, 0], [1, 4]]


def test_partial_sample_ending_on_an_empty_last_sequence_keeps_megatrons_row():
    # Megatron records (last position, length - extra) = (1, -1): the sample reads offset + extra = 0
    # tokens of that empty sequence, which is still right; zero-length sequences do not occur in
    # files written by preprocess_data (empty sentences are dropped).
    index = kernel_sample_index(np.array([0, 2], np.int32), np.array([1, 0], np.int32), 2, 1, False)
    assert index.tolist() == [[0, 0], [1, -1]]


def test_one_token_sequences():
    lengths = np.ones(10, np.int32)
    index = kernel_sample_index(lengths, np.arange(10, dtype=np.int32), 3, 1, True)
    assert index.tolist() == [[0, 0], [3, 0], [6, 0], [9, 0]]


def test_partial_last_sample_is_padded_to_the_end():
    index = kernel_sample_index(np.array([10], np.int32), np.array([0], np.int32), 4, 1, False)
    # ceil((10 - 1) / 4) = 3 samples; the last starts at 8 and its end row marks the last token.
    assert index.tolist() == [[0, 0], [0, 4], [0, 8], [0, 9]]


def test_lengths_near_two_to_the_31():
    big = np.iinfo(np.int32).max
    lengths = np.array([big, 7, big - 1, 1], np.int32)
    document_index = np.array([2, 0, 3, 1], np.int32)
    sequence_length = 2**24 + 3
    ours = kernel_sample_index(lengths, document_index, sequence_length, 1, False)
    assert ours.dtype == np.int32
    expected = reference.sample_index_reference(lengths, document_index, sequence_length, 1, len(ours) - 1)
    np.testing.assert_array_equal(ours, expected)
    assert len(ours) - 1 == -(-(2 * big + 7 - 1) // sequence_length)


weights_strategy = st.lists(st.integers(0, 100), min_size=1, max_size=6).filter(lambda w: sum(w) > 0)


@settings(max_examples=200, deadline=None)
@given(weights=weights_strategy, size=st.integers(0, 400))
def test_blending_kernel_equals_reference_and_follows_the_weights(weights, size):
    weights = np.array(weights, np.float64) / sum(weights)
    dataset_index, sample_index = build_blending_indices(weights, size)
    expected_ids, expected_samples = reference.blending_indices_reference(weights, size)
    np.testing.assert_array_equal(dataset_index, expected_ids)
    np.testing.assert_array_equal(sample_index, expected_samples)
    counts = np.bincount(dataset_index, minlength=len(weights))
    # Step i aims at the share of max(i, 1) samples, one step behind, so a count stays within
    # 1 + w (< 2) samples of the exact share w * size.
    assert np.all(np.abs(counts - weights * size) < 1 + weights + 1e-9)
    for d in range(len(weights)):
        np.testing.assert_array_equal(sample_index[dataset_index == d], np.arange(counts[d]))


@settings(max_examples=200, deadline=None)
@given(sizes=st.lists(st.integers(0, 60), min_size=1, max_size=6))
def test_exhaustive_blending_kernel_equals_reference_and_uses_every_sample_once(sizes):
    dataset_index, sample_index = build_exhaustive_blending_indices(sizes)
    expected_ids, expected_samples = reference.exhaustive_blending_indices_reference(np.array(sizes))
    np.testing.assert_array_equal(dataset_index, expected_ids)
    np.testing.assert_array_equal(sample_index, expected_samples)
    np.testing.assert_array_equal(np.bincount(dataset_index, minlength=len(sizes)), sizes)


def test_blend_of_ten_million_matches_the_weights_exactly():
    dataset_index, _ = build_blending_indices([0.5, 0.3, 0.2], 10_000_000)
    assert np.bincount(dataset_index).tolist() == [5_000_000, 3_000_000, 2_000_000]


def test_megatron_blend_order():
    dataset_index, sample_index = build_blending_indices([0.5, 0.3, 0.2], 12)
    assert dataset_index.tolist() == [0, 1, 2, 0, 1, 0, 2, 0, 1, 0, 0, 1]
    assert sample_index.tolist() == [0, 0, 0, 1, 1, 2, 1, 3, 2, 4, 5, 3]


def test_kernels_fill_preallocated_outputs():
    out = np.empty((3, 2), np.int64)
    kernels.fill_sample_index(np.array([5, 5], np.int32), np.array([0, 1], np.int64), 4, 1, out)
    assert out.tolist() == [[0, 0], [0, 4], [1, 3]]


def test_zero_weight_datasets_are_never_chosen():
    # Megatron's float rounding hands dataset 0 a sample here (all errors ~0 at i = 7).
    dataset_index, _ = build_blending_indices(np.array([0, 2, 5]) / 7, 80)
    assert 0 not in dataset_index
