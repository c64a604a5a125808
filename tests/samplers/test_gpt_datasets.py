"""GPT and blended datasets return Megatron's items; the builder handles blends and empty splits."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from indexed_dataset import IndexedDataset
from samplers import BlendedDataset, GPTDataset, GPTDatasetConfig, build_gpt_datasets
from samplers.errors import BlendFormatError, EmptySplitError
from samplers.gpt.dataset import document_attention_mask, reset_position_ids

LENGTHS = [5, 1, 17, 3, 40, 2, 9, 11, 1, 26, 8, 13]


def config_for(prefixes, tmp_path, weights=None, split="1,0,0", **options) -> GPTDatasetConfig:
    return GPTDatasetConfig(
        sequence_length=options.pop("sequence_length", 8),
        random_seed=3,
        blend=(prefixes, weights),
        split=split,
        path_to_cache=str(tmp_path / "cache"),
        **options,
    )


def epoch_stream(dataset: GPTDataset) -> np.ndarray:
    """The tokens of all epochs in reading order, rebuilt from the document index alone."""
    low = IndexedDataset(dataset.dataset.prefix)
    return np.concatenate([low[int(d)] for d in dataset.indices.document_index]).astype(np.int64)


@pytest.mark.parametrize("extra", [True, False])
def test_items_are_consecutive_windows_of_the_shuffled_epochs(positional_dataset, tmp_path, extra):
    prefix = positional_dataset(LENGTHS)
    train, _, _ = build_gpt_datasets(config_for([prefix], tmp_path, add_extra_token=extra), (30, None, None))
    stream = epoch_stream(train)
    length = 8
    for i in range(len(train)):
        sample = int(train.indices.shuffle_index[i])
        window = stream[sample * length : sample * length + length + extra]
        item = train[i]
        assert item["tokens"].tolist() == window[:length].tolist()
        if extra:
            assert item["labels"].tolist() == window[1:].tolist()
        else:
            assert item["labels"][:-1].tolist() == window[1:].tolist() and item["labels"][-1] == 0
        assert item["tokens"].dtype == torch.long and item["loss_mask"].dtype == torch.float32
        assert item["position_ids"].tolist() == list(range(length))
    assert len(train) >= 30


def test_partial_validation_sample_is_padded_and_masked(positional_dataset, tmp_path):
    prefix = positional_dataset(LENGTHS)
    config = config_for([prefix], tmp_path, split="0,1,0", drop_last_partial_validation_sequence=False)
    _, valid, _ = build_gpt_datasets(config)
    total = sum(LENGTHS)
    assert len(valid) == -(-(total - 1) // 8)  # exact ceil: the partial sample is kept
    last = int(np.flatnonzero(np.asarray(valid.indices.shuffle_index) == len(valid) - 1)[0])
    item = valid[last]
    real_labels = (total - 1) - (len(valid) - 1) * 8
    assert item["loss_mask"].tolist() == [1.0] * real_labels + [0.0] * (8 - real_labels)
    assert item["labels"][real_labels:].tolist() == [0] * (8 - real_labels)  # pad id -1 mapped to 0
    dropping = config_for([prefix], tmp_path, split="0,1,0")
    assert len(build_gpt_datasets(dropping)[1]) == (total - 1) // 8


def test_position_ids_restart_after_eod():
    tokens = np.array([4, 9, 2, 9, 9, 1, 3])
    assert reset_position_ids(tokens, 9).tolist() == [0, 1, 0, 1, 0, 0, 1]


def test_attention_mask_blocks_earlier_documents():
    mask = document_attention_mask(np.array([4, 9, 2, 3]), 9)[0]
    visible = ~mask
    assert visible[3].tolist() == [False, False, True, True]
    assert visible[1].tolist() == [True, True, False, False]


def test_eod_options_apply_to_the_items(positional_dataset, tmp_path):
    prefix = positional_dataset(LENGTHS)
    plain, _, _ = build_gpt_datasets(config_for([prefix], tmp_path))
    eod = int(plain[0]["tokens"][3])
    config = config_for([prefix], tmp_path, eod_id=eod, eod_mask_loss=True, reset_position_ids=True,
                        reset_attention_mask=True)
    item = build_gpt_datasets(config)[0][0]
    assert item["loss_mask"][3] == 0 and item["loss_mask"].sum() == 7
    assert item["position_ids"].tolist() == [0, 1, 2, 3, 0, 1, 2, 3]
    assert item["attention_mask"].shape == (1, 8, 8) and item["attention_mask"].dtype == torch.bool


def test_weighted_blend_items_come_from_the_members(positional_dataset, tmp_path):
    a, b = positional_dataset(LENGTHS, "a"), positional_dataset(LENGTHS[::-1], "b")
    train, _, _ = build_gpt_datasets(config_for([a, b], tmp_path, weights=[3, 1]), (40, None, None))
    assert isinstance(train, BlendedDataset) and len(train) == 40
    assert np.bincount(train.dataset_index).tolist() == [30, 10]
    for i in (0, 1, 17, 39):
        member = train.datasets[int(train.dataset_index[i])]
        expected = member[int(train.dataset_sample_index[i])]
        assert all(torch.equal(train[i][k], expected[k]) for k in expected)
    with pytest.raises(IndexError):
        train[40]


def test_unweighted_blend_is_exhaustive_without_a_size(positional_dataset, tmp_path):
    a, b = positional_dataset(LENGTHS, "a"), positional_dataset(LENGTHS[:6], "b")
    train, _, _ = build_gpt_datasets(config_for([a, b], tmp_path))
    sizes = [len(d) for d in train.datasets]
    assert len(train) == sum(sizes) and np.bincount(train.dataset_index).tolist() == sizes
    capped, _, _ = build_gpt_datasets(config_for([a, b], tmp_path), (5, None, None))
    assert len(capped) == 5


def test_weighted_blend_needs_a_size(positional_dataset, tmp_path):
    a, b = positional_dataset(LENGTHS, "a"), positional_dataset(LENGTHS, "b")
    with pytest.raises(BlendFormatError, match="needs a number of train samples"):
        build_gpt_datasets(config_for([a, b], tmp_path, weights=[1, 1]))


def test_blend_per_split_uses_each_dataset_whole(positional_dataset, tmp_path):
    a, b = positional_dataset(LENGTHS, "a"), positional_dataset(LENGTHS[:4], "b")
    config = GPTDatasetConfig(
        sequence_length=4, blend_per_split=[([a], None), ([b], [1.0]), None], path_to_cache=str(tmp_path)
    )
    train, valid, test = build_gpt_datasets(config)
    assert isinstance(train, GPTDataset) and len(train) == (sum(LENGTHS) - 1) // 4
    assert isinstance(valid, GPTDataset) and len(valid) == (sum(LENGTHS[:4]) - 1) // 4
    assert test is None


def test_absent_and_empty_splits(positional_dataset, tmp_path):
    prefix = positional_dataset(LENGTHS)
    # "99,1,0": no test split at all, even if samples are asked (Megatron builds none).
    train, valid, test = build_gpt_datasets(config_for([prefix], tmp_path, split="99,1,0"), (5, None, 7))
    assert test is None and valid is None  # 1% of 12 sequences rounds to none
    with pytest.raises(EmptySplitError, match="valid split"):
        build_gpt_datasets(config_for([prefix], tmp_path, split="99,1,0"), (5, 3, None))


@pytest.mark.parametrize(
    "options, field",
    [
        ({"sequence_length": 0}, "sequence_length"),
        ({"split": None}, "split"),
        ({"reset_position_ids": True}, "eod_id"),
    ],
)
def test_config_errors_name_the_field(options, field, tmp_path):
    with pytest.raises(ValueError, match=field):
        config_for(["x"], tmp_path, **options)


@settings(max_examples=40, deadline=None)
@given(weights=st.lists(st.integers(0, 1000), min_size=3, max_size=3).filter(lambda w: sum(w) > 0),
       size=st.integers(1, 3000))
def test_weighted_blends_never_ask_a_member_for_more_than_it_has(three_datasets, weights, size):
    from samplers.builder import build_split_indices

    config = GPTDatasetConfig(sequence_length=16, blend=(three_datasets, weights), split="1,0,0",
                              path_to_cache=os.path.join(os.path.dirname(three_datasets[0]), "cache"))
    blend = build_split_indices(config, (size, None, None))[0]
    counts = np.bincount(blend.dataset_index, minlength=3)
    for member, count, weight in zip(blend.members, counts, weights):
        if weight == 0:
            assert member is None and count == 0  # never sampled, so never built
        else:
            assert count <= len(member)
    assert len(blend) >= size
