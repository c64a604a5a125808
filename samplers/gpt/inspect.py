"""What a dataset (or a blend) becomes for a given sequence length, split and seed: the library side of
`inspect-index`'s training view.

    report = inspect_splits("data/x_text_document", sequence_length=2048, split="949,50,1", seed=1234,
                            sizes=(None, None, None), sample_ids=(0, 1, -1))
    for s in report:          # one SplitInspection per split, None where the split is absent
        print(s.split, s.num_epochs, s.num_samples, s.samples[0][:16])   # token ids; decode them in the CLI
    report = inspect_blend_splits((["data/a", "data/b"], [0.3, 0.7]), 2048, "949,50,1", 1234,
                                  sizes=(4000, 200, 20))   # a BlendInspection per blended split

Indices come from (and go to) the same cache training uses (`index-cache/` beside the data unless
`path_to_cache` is given; kept in memory if that is not writable), so inspecting also pre-builds them.
Sample k is item k of the split as training sees it (after the shuffle). Datasets may be of any format
tokenmill writes (`samplers.sources.TokenSource`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence, Union

import numpy as np

from ..builder import BlendedSplit, MidLevelSplit, build_split_indices
from ..config import Blend, GPTDatasetConfig
from .indices import read_sample


@dataclass(frozen=True)
class SplitInspection:
    """One split of one dataset under a sampling configuration."""

    split: str
    """"train", "valid" or "test"."""
    sequence_range: tuple[int, int]
    """[begin, end) sequence ids of the split."""
    num_tokens_per_epoch: int
    num_epochs: int
    separate_final_epoch: bool
    """Whether the last epoch is shuffled apart (it then supplies the last samples)."""
    num_samples: int
    """Samples of the split (len of its dataset), >= the requested size."""
    samples: dict[int, np.ndarray]
    """Requested item number -> its L + extra token ids (int64; pad id -1 fills a partial sample)."""


@dataclass(frozen=True)
class BlendInspection:
    """One split of a blend: its members' splits and the chosen samples."""

    split: str
    num_samples: int
    """Samples of the blended split."""
    weights: list[float]
    """The blend's normalised weights (per member; for an unweighted blend, its members' shares)."""
    members: list[Optional[SplitInspection]]
    """Each member's split (no samples of its own), None for a member this split never draws from."""
    samples: dict[int, tuple[int, np.ndarray]]
    """Requested item number -> (member it comes from, its L + extra token ids)."""


def _member_inspection(split: MidLevelSplit, samples: dict[int, np.ndarray]) -> SplitInspection:
    indices = split.indices
    return SplitInspection(
        split=split.split,
        sequence_range=(split.description["begin"], split.description["end"]),
        num_tokens_per_epoch=indices.plan.num_tokens_per_epoch,
        num_epochs=indices.plan.num_epochs,
        separate_final_epoch=indices.plan.separate_final_epoch,
        num_samples=len(indices),
        samples=samples,
    )


def _read(split: MidLevelSplit, config: GPTDatasetConfig, item: int) -> np.ndarray:
    return read_sample(split.dataset, split.indices, item, config.sequence_length, config.extra_tokens, config.pad_id)


def _blend_inspection(split: BlendedSplit, config: GPTDatasetConfig, sample_ids: Sequence[int]) -> BlendInspection:
    samples = {}
    for sample_id in sample_ids:
        if -len(split) <= sample_id < len(split):
            member = int(split.dataset_index[sample_id])
            member_item = int(split.dataset_sample_index[sample_id])
            samples[sample_id] = (member, _read(split.members[member], config, member_item))
    counts = np.bincount(split.dataset_index, minlength=len(split.members))
    return BlendInspection(
        split=split.split,
        num_samples=len(split),
        weights=(counts / max(len(split), 1)).tolist(),
        members=[_member_inspection(member, {}) if member is not None else None for member in split.members],
        samples=samples,
    )


def inspect_blend_splits(
    blend: Blend,
    sequence_length: int,
    split: str,
    seed: int,
    sizes: Optional[Sequence[Optional[int]]] = None,
    sample_ids: Sequence[int] = (0,),
    add_extra_token: bool = True,
    path_to_cache: Optional[str] = None,
) -> list[Optional[Union[SplitInspection, BlendInspection]]]:
    """Epochs, sample counts and chosen samples of each split of a blend, as `train --data-path` builds it.

    Args:
        blend: (dataset paths, weights or None), as `samplers.splits.parse_blend` returns it.
        sequence_length, split, seed, sizes, sample_ids, add_extra_token, path_to_cache: see `inspect_splits`.

    Returns:
        Three entries: a SplitInspection where the split is one dataset's (a single unweighted
        dataset), a BlendInspection where it is a blend, None where it is absent.

    Raises:
        EmptySplitError, BlendFormatError, BlendSizeError, IndexFormatError, SplitFormatError: see
            `builder.build_split_indices`.
    """
    config = GPTDatasetConfig(
        sequence_length=sequence_length,
        random_seed=seed,
        blend=blend,
        split=split,
        path_to_cache=path_to_cache,
        add_extra_token=add_extra_token,
    )
    report: list[Optional[Union[SplitInspection, BlendInspection]]] = []
    for split_indices in build_split_indices(config, sizes):
        if split_indices is None:
            report.append(None)
        elif isinstance(split_indices, BlendedSplit):
            report.append(_blend_inspection(split_indices, config, sample_ids))
        else:
            length = len(split_indices)
            samples = {i: _read(split_indices, config, i) for i in sample_ids if -length <= i < length}
            report.append(_member_inspection(split_indices, samples))
    return report


def inspect_splits(
    prefix: str,
    sequence_length: int,
    split: str,
    seed: int,
    sizes: Optional[Sequence[Optional[int]]] = None,
    sample_ids: Sequence[int] = (0,),
    add_extra_token: bool = True,
    path_to_cache: Optional[str] = None,
) -> list[Optional[SplitInspection]]:
    """Epochs, sample counts and chosen samples of each split of one dataset.

    Args:
        prefix: dataset path (`data/x_text_document`, an Arrow folder or a `.mindrecord` file).
        sequence_length: tokens per sample L.
        split: split string such as "949,50,1".
        seed: random seed of the shuffles.
        sizes: samples wanted per split (None entries: one epoch).
        sample_ids: item numbers to return the tokens of (negative counts from the end; ids out of
            a split's range are skipped for that split).
        add_extra_token: samples read L + 1 tokens (Megatron's default).
        path_to_cache: the index cache directory; None: `index-cache/` beside the data.

    Returns:
        Three entries (train, valid, test): a SplitInspection, or None for an absent split, or an
        empty one that was asked for no samples.

    Raises:
        EmptySplitError: an empty split was asked for samples.
        IndexFormatError: the dataset's files are missing or damaged.
        SplitFormatError: the split string is malformed.
    """
    return inspect_blend_splits(([prefix], None), sequence_length, split, seed, sizes, sample_ids, add_extra_token,
                                path_to_cache)
