"""Blends of T5 span-corruption datasets (``--data-path 0.7 A 0.3 B``), weighted as the GPT blends are:

- the interleaving is the GPT blend's `build_blending_indices` over the normalised weights, for the sum of
  the members' shares; each member's split is built for its share plus Megatron's surplus;
- an item of the blend is its member's item;
- without weights each member gives one epoch and weighs by its sample count (exhaustive without a size);
- the blend indices are cached: a second build loads them.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_t5_dataset import make_config, write_sentence_dataset

from samplers.errors import BlendFormatError
from samplers.indices import MID_LEVEL_DATASET_SURPLUS, blend_sizes, build_blending_indices
from samplers.t5.blend import T5BlendedDataset, build_t5_blend
from samplers.t5.dataset import T5Dataset

WEIGHTS = (0.7, 0.3)
SIZES = (300, 20, None)


@pytest.fixture(scope="module")
def two_datasets(tmp_path_factory) -> list[str]:
    directory = tmp_path_factory.mktemp("t5_blend")
    return [write_sentence_dataset(directory / f"{name}_text_sentence", 120, seed=seed)
            for name, seed in (("a", 1), ("b", 2))]


def test_a_weighted_blend_interleaves_as_the_gpt_blend(two_datasets, tmp_path):
    config = make_config(two_datasets[0], tmp_path)
    train, valid, test = build_t5_blend(two_datasets, WEIGHTS, config, SIZES)
    assert isinstance(train, T5BlendedDataset) and test is None  # split 90,10,0
    for split, size in ((train, SIZES[0]), (valid, SIZES[1])):
        expected_size = sum(blend_sizes(WEIGHTS, size))
        dataset_index, sample_index = build_blending_indices(list(WEIGHTS), expected_size)
        assert len(split) == expected_size
        assert np.array_equal(split.dataset_index, dataset_index)
        assert np.array_equal(split.dataset_sample_index, sample_index)
        for member, share in zip(split.members, blend_sizes(WEIGHTS, size, MID_LEVEL_DATASET_SURPLUS)):
            assert isinstance(member, T5Dataset) and len(member) >= share
    assert [m.dataset.prefix for m in train.members] == two_datasets
    assert np.bincount(train.dataset_index).tolist() == [210, 90]


def test_an_item_of_the_blend_is_its_members_item(two_datasets, tmp_path):
    train = build_t5_blend(two_datasets, WEIGHTS, make_config(two_datasets[0], tmp_path), SIZES)[0]
    for i in (0, 1, 2, 57, len(train) - 1):
        member = train.members[int(train.dataset_index[i])]
        expected = member[int(train.dataset_sample_index[i])]
        item = train[i]
        assert item.keys() == expected.keys()
        assert all(torch.equal(item[key], expected[key]) for key in item)
    with pytest.raises(IndexError):
        train[len(train)]


def test_weights_need_not_sum_to_one(two_datasets, tmp_path):
    config = make_config(two_datasets[0], tmp_path)
    normalised = build_t5_blend(two_datasets, WEIGHTS, config, SIZES)[0]
    scaled = build_t5_blend(two_datasets, (7, 3), config, SIZES)[0]
    assert np.array_equal(normalised.dataset_index, scaled.dataset_index)


def test_without_weights_each_member_gives_one_epoch(two_datasets, tmp_path):
    config = make_config(two_datasets[0], tmp_path)
    train = build_t5_blend(two_datasets, None, config, (None, None, None))[0]
    lengths = [len(member) for member in train.members]
    assert len(train) == sum(lengths)
    assert np.bincount(train.dataset_index).tolist() == lengths
    assert sorted(zip(train.dataset_index.tolist(), train.dataset_sample_index.tolist())) == \
        [(member, k) for member, n in enumerate(lengths) for k in range(n)]


def test_one_prefix_is_its_plain_dataset(two_datasets, tmp_path):
    train = build_t5_blend(two_datasets[:1], None, make_config(two_datasets[0], tmp_path), SIZES)[0]
    assert isinstance(train, T5Dataset)


def test_the_blend_indices_are_cached(two_datasets, tmp_path):
    config = make_config(two_datasets[0], tmp_path)
    first = build_t5_blend(two_datasets, WEIGHTS, config, SIZES)[0]
    assert list(tmp_path.glob("t5-blend-train*"))
    again = build_t5_blend(two_datasets, WEIGHTS, config, SIZES)[0]
    assert np.array_equal(first.dataset_index, again.dataset_index)


@pytest.mark.parametrize(("weights", "sizes", "message"), [
    ((0.5,), SIZES, "1 weights for 2 datasets"),
    (WEIGHTS, (None, None, None), "the weighted blend needs a number of train samples"),
    ((-1, 2), SIZES, "weights must be finite and >= 0"),
])
def test_bad_blends_are_one_clear_error(two_datasets, tmp_path, weights, sizes, message):
    with pytest.raises(BlendFormatError, match=message):
        build_t5_blend(two_datasets, weights, make_config(two_datasets[0], tmp_path), sizes)
