"""Blends of T5 span-corruption datasets, weighted as the GPT blends are (megatron-core's BlendedDataset).

    train, valid, test = build_t5_blend(["data/a_text_sentence", "data/b_text_sentence"], [0.7, 0.3],
                                        config, sizes=(10000, 100, None))
    train[i] == members[dataset_index[i]][dataset_sample_index[i]]

Megatron builds a T5 blend with the same `BlendedMegatronDatasetBuilder` as a GPT one, so the math is the
GPT builder's (`samplers.indices`): weights normalised in float64; each member's split built for its share
plus `MID_LEVEL_DATASET_SURPLUS` (`blend_sizes`); the interleaving `build_blending_indices(weights, size)`
(deterministic, no RNG), cached. Without weights (``--dataset A B``) each member gives one epoch and the
members are weighted by their sample counts, exhaustively when no size is asked. Every member shares the
sample options of `T5DatasetConfig` (its ``data_prefix`` is replaced by the member's).

Per-split blends (``--train-data-path 0.5 A 0.5 B --valid-data-path C``, `build_t5_blend_per_split`) are one
such blend per split, each member used whole.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Optional, Sequence

import numpy as np
import torch

from ..builder import BLEND_INDEX_KINDS, Sizes, _check_member_sizes, default_cache_directory, size_weighted_blend
from ..cache import IndexCache
from ..config import Blend
from ..errors import BlendFormatError
from ..indices import MID_LEVEL_DATASET_SURPLUS, blend_sizes, build_blend_indices
from ..splits import SPLIT_NAMES, normalize_weights
from .dataset import T5_CACHE_FORMAT, T5Dataset, T5DatasetConfig, build_t5_datasets

logger = logging.getLogger(__name__)


class T5BlendedDataset(torch.utils.data.Dataset):
    """One split of a blend; items are the members' items.

    Args:
        split: "train", "valid" or "test".
        members: each member's split (None: a member never sampled in this split).
        dataset_index: member id of every sample (int16/int32 [n]).
        dataset_sample_index: the sample's id inside its member (int64 [n]).
    """

    def __init__(self, split: str, members: Sequence[Optional[T5Dataset]], dataset_index: np.ndarray,
                 dataset_sample_index: np.ndarray) -> None:
        self.split = split
        self.members = list(members)
        self.dataset_index = dataset_index
        self.dataset_sample_index = dataset_sample_index

    def __len__(self) -> int:
        return len(self.dataset_index)

    def __getitem__(self, idx: int) -> dict[str, torch.Tensor]:
        idx = range(len(self))[int(idx)]
        return self.members[int(self.dataset_index[idx])][int(self.dataset_sample_index[idx])]


def build_t5_blend(prefixes: Sequence[str], weights: Optional[Sequence[float]], config: T5DatasetConfig,
                   sizes: Sizes) -> tuple[Optional[torch.utils.data.Dataset], ...]:
    """The train, valid and test splits of a blend of sentence-split datasets (one prefix: its plain splits).

    Args:
        prefixes: the members' dataset prefixes.
        weights: one per prefix (normalised here), or None: weighted by the members' sample counts.
        config: the sample options every member shares.
        sizes: samples wanted per split (a weighted blend needs a count for every split it has).

    Returns:
        (train, valid, test), None for a split the blend does not have.

    Raises:
        BlendFormatError: weights that do not match the prefixes, or a weighted split without a size.
        EmptySplitError: a member's split yields no sample but samples are asked of it.
        BlendSizeError: the blend takes more samples of a member than it holds.
    """
    sizes = tuple(sizes) if sizes is not None else (None,) * len(SPLIT_NAMES)
    if weights is not None and len(weights) != len(prefixes):
        raise BlendFormatError(f"{len(weights)} weights for {len(prefixes)} datasets")
    if len(prefixes) == 1:
        return build_t5_datasets(dataclasses.replace(config, data_prefix=prefixes[0]), sizes)
    if weights is not None:
        weights = normalize_weights(weights)
        member_sizes = [tuple(blend_sizes([w], size, MID_LEVEL_DATASET_SURPLUS)[0] if size else size
                              for size in sizes) for w in weights]
    else:
        member_sizes = [(None,) * len(SPLIT_NAMES)] * len(prefixes)
    members = [build_t5_datasets(dataclasses.replace(config, data_prefix=prefix), member_size)
               for prefix, member_size in zip(prefixes, member_sizes)]
    cache = IndexCache(config.path_to_cache or default_cache_directory(prefixes[0]))
    return tuple(_blend_split(name, [member[split] for member in members], weights, sizes[split], cache)
                 for split, name in enumerate(SPLIT_NAMES))


def build_t5_blend_per_split(blends: Sequence[Optional[Blend]], config: T5DatasetConfig,
                             sizes: Sizes) -> tuple[Optional[torch.utils.data.Dataset], ...]:
    """The train, valid and test splits of per-split blends (Megatron's ``--train-data-path`` ...): each split
    is its own blend, every member used whole, blended as `build_t5_blend` blends one split.

    Args:
        blends: one (prefixes, weights or None) per split (train, valid, test); None: the split is absent.
        config: the sample options every member shares (its ``split`` is replaced).
        sizes: samples wanted per split (a weighted blend needs a count).

    Returns:
        (train, valid, test), None for a split without a blend.

    Raises:
        BlendFormatError: not one entry per split, or `build_t5_blend`'s.
        EmptySplitError, BlendSizeError: as `build_t5_blend`.
    """
    if len(blends) != len(SPLIT_NAMES):
        raise BlendFormatError(f"per-split blends need {len(SPLIT_NAMES)} entries, got {len(blends)}")
    sizes = tuple(sizes) if sizes is not None else (None,) * len(SPLIT_NAMES)
    splits: list[Optional[torch.utils.data.Dataset]] = []
    for index, blend in enumerate(blends):
        if blend is None:
            splits.append(None)
            continue
        # A split string giving this split every document and the others none: the member is used whole,
        # and its samples are this split's (the split's name seeds and names its cached index, as in Megatron).
        whole = ",".join("1" if other == index else "0" for other in range(len(SPLIT_NAMES)))
        only = tuple(size if other == index else None for other, size in enumerate(sizes))
        prefixes, weights = blend
        splits.append(build_t5_blend(prefixes, weights, dataclasses.replace(config, split=whole), only)[index])
    return tuple(splits)


def _blend_split(name: str, members: list[Optional[T5Dataset]], weights: Optional[list[float]],
                 size: Optional[int], cache: IndexCache) -> Optional[T5BlendedDataset]:
    """One split of the blend (megatron-core's `_build_blended_dataset_splits` for one split)."""
    if all(member is None for member in members):
        return None
    if weights is not None:
        if size is None:
            raise BlendFormatError(f"the weighted blend needs a number of {name} samples")
        exhaustive = False
        size = sum(blend_sizes(weights, size))
    else:
        plan = size_weighted_blend([len(member) if member is not None else 0 for member in members], size, name)
        if plan is None:
            return None
        weights, size, exhaustive = plan
    description = {
        "class": "T5BlendedDataset",
        "format": T5_CACHE_FORMAT,
        "members": [[m.dataset.fingerprint(), list(m.document_range), len(m)] if m is not None else None
                    for m in members],
        "weights": list(weights),
        "size": size,
        "exhaustive": exhaustive,
    }

    def build() -> dict[str, np.ndarray]:
        members_named = ", ".join(m.dataset.prefix for m in members if m is not None)
        arrays = build_blend_indices(weights, size, exhaustive, f"the {name} T5 blend of {members_named}: {size} samples")
        return dict(zip(BLEND_INDEX_KINDS, arrays))

    arrays = cache.load_or_build(f"t5-blend-{name}", description, BLEND_INDEX_KINDS, build)
    _check_member_sizes(members, arrays["dataset_index"], name)
    logger.info("T5 blend %s: %d samples from %d datasets", name, size, len(members))
    return T5BlendedDataset(name, members, arrays["dataset_index"], arrays["dataset_sample_index"])
