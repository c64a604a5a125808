"""From a `GPTDatasetConfig` and the wanted sample counts to the index arrays of every split (no torch).

    splits = build_split_indices(config, sizes=(4000, 200, 20))
    splits[0]          # MidLevelSplit (one dataset), BlendedSplit (a blend) or None (no such split)

This follows megatron-core's BlendedMegatronDatasetBuilder: a single unweighted prefix gives plain
GPT splits; a blend builds each member's split with its weighted share plus a surplus and then
interleaves them; an unweighted blend takes one epoch of each member (exhaustively, or up to the
requested size in proportion to the members' lengths); mock data (`config.mock`) is one dataset, Megatron's
synthetic documents, in place of a prefix. `build_gpt_datasets` wraps the result in torch Datasets.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Callable, Optional, Sequence, Union

import numpy as np

from .cache import IndexCache, description_hash
from .config import GPTDatasetConfig
from .errors import BlendFormatError, BlendSizeError, EmptySplitError
from .gpt.indices import (
    CACHE_FORMAT,
    GPTIndexSpec,
    GPTIndices,
    PhaseTimings,
    gpt_index_description,
    load_or_build_gpt_indices,
)
from .mock import MOCK_NAME, MockTokenSource
from .indices import blend_sizes, build_blend_indices
from .sources import TokenSource
from .splits import SPLIT_NAMES, normalize_weights, split_ranges

logger = logging.getLogger(__name__)

DEFAULT_CACHE_DIRNAME = "index-cache"
"""Default cache directory, a sibling of the dataset files (`data/x.bin` -> `data/index-cache/`)."""

BLEND_INDEX_KINDS = ("dataset_index", "dataset_sample_index")

Sizes = tuple[Optional[int], Optional[int], Optional[int]]
RangeOf = Callable[[TokenSource], Optional[tuple[int, int]]]
MOCK_BLEND = ([MOCK_NAME], None)
"""The blend of mock data: its one source, named."""


@dataclass(frozen=True)
class MidLevelSplit:
    """One dataset's split: the low-level dataset, the split name and its index arrays."""

    dataset: TokenSource
    split: str
    indices: GPTIndices
    description: dict

    def __len__(self) -> int:
        return len(self.indices)


@dataclass(frozen=True)
class BlendedSplit:
    """A split interleaved from several members (None: a member without samples in this split)."""

    members: list[Optional[MidLevelSplit]]
    split: str
    dataset_index: np.ndarray
    dataset_sample_index: np.ndarray

    def __len__(self) -> int:
        return len(self.dataset_index)


SplitIndices = Union[MidLevelSplit, BlendedSplit]


def default_cache_directory(prefix: str) -> str:
    """`index-cache/` in the directory holding the dataset's `.bin/.idx`."""
    return os.path.join(os.path.dirname(os.path.abspath(prefix)), DEFAULT_CACHE_DIRNAME)


class _Builder:
    """Opens each dataset once and builds (or loads) the splits of one config."""

    def __init__(self, config: GPTDatasetConfig, timings: PhaseTimings) -> None:
        self.config = config
        self.timings = timings
        self.datasets: dict[str, TokenSource | MockTokenSource] = {}

    def dataset(self, prefix: str) -> TokenSource | MockTokenSource:
        if prefix not in self.datasets:
            config = self.config
            self.datasets[prefix] = (MockTokenSource(config.vocab_size, config.eod_id) if config.mock
                                     else TokenSource(prefix, mmap_bin=config.mmap_bin_files))
        return self.datasets[prefix]

    def cache(self, prefix: str) -> IndexCache:
        if self.config.mock:  # no files to sit beside: in memory unless given a directory, as Megatron
            return IndexCache(self.config.path_to_cache)
        return IndexCache(self.config.path_to_cache or default_cache_directory(prefix))

    def mid_level(self, prefix: str, split: int, range_of: RangeOf, num_samples: Optional[int]) -> Optional[MidLevelSplit]:
        """One dataset's split; None when the split is absent, or empty with no samples asked."""
        dataset = self.dataset(prefix)
        name = SPLIT_NAMES[split]
        sequence_range = range_of(dataset)
        if sequence_range is None:
            return None
        begin, end = sequence_range
        if begin == end:
            if num_samples:
                raise EmptySplitError(
                    f"{prefix}: the {name} split ({self.config.split!r}) covers no sequence of the "
                    f"{len(dataset)} in the dataset, but {num_samples} samples were requested",
                    split=name,
                )
            return None
        config = self.config
        spec = GPTIndexSpec(
            begin=begin,
            end=end,
            num_samples=num_samples,
            sequence_length=config.sequence_length,
            random_seed=config.random_seed,
            extra_tokens=config.extra_tokens,
            # Megatron keeps a partial last sample only for validation, and only on request.
            drop_last_partial_sample=name != "valid" or config.drop_last_partial_validation_sequence,
            separate_final_epoch_threshold=config.separate_final_epoch_threshold,
        )
        try:
            indices = load_or_build_gpt_indices(dataset, name, spec, self.cache(prefix), self.timings)
        except EmptySplitError as error:
            raise EmptySplitError(f"{prefix}: {name} split: {error}", split=name) from None
        return MidLevelSplit(dataset, name, indices, gpt_index_description(dataset, name, spec))

    def blended(
        self, prefixes: Sequence[str], weights: Optional[Sequence[float]], split: int, range_of: RangeOf, size: Optional[int]
    ) -> Optional[BlendedSplit]:
        """A blend's split (Megatron's _build_blended_dataset_splits for one split)."""
        name = SPLIT_NAMES[split]
        if any(range_of(self.dataset(prefix)) is None for prefix in prefixes):
            return None
        if weights is not None:
            if size is None:
                raise BlendFormatError(f"the weighted blend needs a number of {name} samples")
            weights = normalize_weights(weights)
            shares = blend_sizes(weights, size)
            targets = blend_sizes(weights, size, self.config.mid_level_dataset_surplus)
            # A zero-weight member is never sampled, so it is not built (Megatron builds an epoch of it).
            members = [self.mid_level(p, split, range_of, t) if t else None for p, t in zip(prefixes, targets)]
            size, exhaustive = sum(shares), False
        else:
            members = [self.mid_level(p, split, range_of, None) for p in prefixes]
            plan = size_weighted_blend([len(member) if member is not None else 0 for member in members], size, name)
            if plan is None:
                return None
            weights, size, exhaustive = plan
        description = {
            "class": "BlendedDataset",
            "format": CACHE_FORMAT,
            "members": [description_hash(m.description) if m is not None else None for m in members],
            "weights": list(weights),
            "size": size,
            "exhaustive": exhaustive,
        }

        def build() -> dict[str, np.ndarray]:
            with self.timings.measure("blend_index"):
                arrays = build_blend_indices(weights, size, exhaustive,
                                             f"the {name} blend of {', '.join(prefixes)}: {size} samples")
            return dict(zip(BLEND_INDEX_KINDS, arrays))

        arrays = self.cache(prefixes[0]).load_or_build(f"blend-{name}", description, BLEND_INDEX_KINDS, build)
        _check_member_sizes(members, arrays["dataset_index"], name)
        return BlendedSplit(members, name, arrays["dataset_index"], arrays["dataset_sample_index"])


def size_weighted_blend(lengths: Sequence[int], size: Optional[int],
                        split_name: str) -> Optional[tuple[list[float], int, bool]]:
    """(weights, size, exhaustive) of a blend without weights, whose members hold ``lengths`` samples: every
    sample once (exhaustive) when no size is asked, else ``size`` (at most all) in proportion to the lengths;
    None when the members hold no sample and none is asked.

    Raises:
        EmptySplitError: samples asked of members that hold none.
    """
    if sum(lengths) == 0:
        if size:
            raise EmptySplitError(f"the {split_name} split of the blend has no samples, but {size} were requested",
                                  split=split_name)
        return None
    if size is None:
        return list(lengths), sum(lengths), True
    return normalize_weights(lengths), min(size, sum(lengths)), False


def _check_member_sizes(members: Sequence[Optional[MidLevelSplit]], dataset_index: np.ndarray, split_name: str) -> None:
    """Raise BlendSizeError if the blend takes more samples from a member than the member holds."""
    counts = np.bincount(dataset_index, minlength=len(members))
    for member_id, (member, count) in enumerate(zip(members, counts)):
        available = len(member) if member is not None else 0
        if count > available:
            raise BlendSizeError(
                f"the {split_name} blend takes {count} samples from member {member_id}"
                f" ({member.dataset.prefix if member else 'empty'}), which has only {available}; "
                "raise mid_level_dataset_surplus"
            )


def build_split_indices(
    config: GPTDatasetConfig, sizes: Optional[Sizes] = None, timings: Optional[PhaseTimings] = None
) -> list[Optional[SplitIndices]]:
    """Index arrays of the train, valid and test splits, loaded from the cache or built.

    Args:
        config: datasets, split and sampling parameters.
        sizes: samples wanted per split (None entries, or sizes None: one epoch of each dataset).
        timings: accumulates build seconds per phase (document/sample/shuffle/blend index).

    Returns:
        Three entries: MidLevelSplit, BlendedSplit, or None for a split that is absent (zero
        fraction, no blend) or empty with no samples asked.

    Raises:
        EmptySplitError: a split with no sequences or tokens was asked for samples.
        BlendSizeError: a blend needs more samples of a member than it has.
        BlendFormatError: a weighted blend was given no size.
        IndexFormatError: a dataset's files are missing or damaged.
    """
    sizes = tuple(sizes) if sizes is not None else (None,) * len(SPLIT_NAMES)
    if len(sizes) != len(SPLIT_NAMES) or any(s is not None and s < 0 for s in sizes):
        raise ValueError(f"sizes must be three counts >= 0 or None, got {sizes}")
    builder = _Builder(config, timings if timings is not None else PhaseTimings())
    splits: list[Optional[SplitIndices]] = []
    blend = MOCK_BLEND if config.mock else config.blend
    for split in range(len(SPLIT_NAMES)):
        if blend is not None:
            prefixes, weights = blend
            range_of: RangeOf = lambda dataset, split=split: split_ranges(config.split, len(dataset))[split]
        elif config.blend_per_split[split] is not None:
            prefixes, weights = config.blend_per_split[split]
            range_of = lambda dataset: (0, len(dataset))
        else:
            splits.append(None)
            continue
        if len(prefixes) == 1 and (weights is None or blend is None):
            splits.append(builder.mid_level(prefixes[0], split, range_of, sizes[split]))
        else:
            splits.append(builder.blended(prefixes, weights, split, range_of, sizes[split]))
    return splits
