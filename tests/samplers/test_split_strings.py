"""Split strings and blend lists parse as in megatron-core."""

from __future__ import annotations

import pytest

from samplers.errors import BlendFormatError, SplitFormatError
from samplers.splits import parse_blend, parse_split, split_bookends, split_ranges


def test_split_is_normalised_and_padded_with_zeros():
    assert parse_split("949,50,1") == [0.949, 0.05, 0.001]
    assert parse_split("99/1") == [0.99, 0.01, 0.0]
    assert parse_split("1") == [1.0, 0.0, 0.0]


def test_zero_fractions_are_absent_splits():
    assert split_bookends("99,1,0")[2] is None
    assert split_bookends("0,1,0") == [None, (0.0, 1.0), None]


def test_ranges_of_a_million_sequences():
    assert split_ranges("949,50,1", 1_000_000) == [(0, 949_000), (949_000, 999_000), (999_000, 1_000_000)]


def test_ranges_round_half_to_even_like_megatron():
    # 0.5 * 5 = 2.5 rounds to 2 with Python's round, as in Megatron.
    assert split_ranges("1,1", 5) == [(0, 2), (2, 5), None]


def test_a_small_fraction_can_give_an_empty_range():
    assert split_ranges("949,50,1", 232)[2] == (232, 232)


@pytest.mark.parametrize("bad", ["", "a,b", "0,0,0", "1,2,3,4", "1..2,3"])
def test_bad_split_strings_raise(bad):
    with pytest.raises(SplitFormatError):
        parse_split(bad)


def test_blend_with_weights():
    assert parse_blend("0.3 data/a 0.7 data/b") == (["data/a", "data/b"], [0.3, 0.7])
    assert parse_blend(["1", "a", "2", "b"]) == (["a", "b"], [1.0, 2.0])


def test_blend_of_prefixes_only():
    assert parse_blend("data/a") == (["data/a"], None)
    assert parse_blend("data/a data/b") == (["data/a", "data/b"], None)


@pytest.mark.parametrize("bad", ["", "0.3 a b c", "-1 a 2 b"])
def test_bad_blends_raise(bad):
    with pytest.raises(BlendFormatError):
        parse_blend(bad)
