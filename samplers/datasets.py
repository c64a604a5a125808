"""`build_gpt_datasets`: the train, valid and test torch Datasets of a `GPTDatasetConfig`.

    train, valid, test = build_gpt_datasets(config, sizes=(n_train, n_valid, None))
"""

from __future__ import annotations

from typing import Optional, Union

from .blended_dataset import BlendedDataset
from .builder import MidLevelSplit, Sizes, build_split_indices
from .config import GPTDatasetConfig
from .gpt.dataset import GPTDataset
from .gpt.indices import PhaseTimings

TopLevelDataset = Union[GPTDataset, BlendedDataset]


def build_gpt_datasets(
    config: GPTDatasetConfig, sizes: Optional[Sizes] = None, timings: Optional[PhaseTimings] = None
) -> tuple[Optional[TopLevelDataset], Optional[TopLevelDataset], Optional[TopLevelDataset]]:
    """Build (or load from the index cache) the three splits' datasets.

    Args:
        config: datasets, split and sample options.
        sizes: samples wanted per split; None (or a None entry) means one epoch. A dataset may hold
            more samples than asked (up to the end of its last epoch), as in Megatron.
        timings: accumulates the index build seconds per phase, if given.

    Returns:
        (train, valid, test): a GPTDataset (single dataset), a BlendedDataset (blend), or None
        when the split is absent or empty and no samples were asked of it.

    Raises:
        EmptySplitError, BlendSizeError, BlendFormatError, IndexFormatError: see
            `builder.build_split_indices`.
    """
    datasets = []
    for split in build_split_indices(config, sizes, timings):
        if split is None:
            datasets.append(None)
        elif isinstance(split, MidLevelSplit):
            datasets.append(GPTDataset(split, config))
        else:
            datasets.append(BlendedDataset(split, config))
    return tuple(datasets)
