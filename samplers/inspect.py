"""What a dataset becomes for a given sequence length, split and seed: the library side of `inspect-index`.

    report = inspect_splits("data/x_text_document", sequence_length=2048, split="949,50,1", seed=1234,
                            sizes=(None, None, None), sample_ids=(0, 1, -1))
    for s in report:          # one SplitInspection per split, None where the split is absent
        print(s.split, s.num_epochs, s.num_samples, s.samples[0][:16])   # token ids; decode them in the CLI

Indices come from (and go to) the same cache training uses (`index-cache/` beside the data unless
`path_to_cache` is given; kept in memory if that is not writable), so inspecting also pre-builds them.
Sample k is item k of the split as training sees it (after the shuffle).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

from .builder import build_split_indices
from .config import GPTDatasetConfig
from .gpt_indices import read_sample


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
        prefix: dataset prefix (`data/x_text_document`).
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
    config = GPTDatasetConfig(
        sequence_length=sequence_length,
        random_seed=seed,
        blend=([prefix], None),
        split=split,
        path_to_cache=path_to_cache,
        add_extra_token=add_extra_token,
    )
    report: list[Optional[SplitInspection]] = []
    for split_indices in build_split_indices(config, sizes):
        if split_indices is None:
            report.append(None)
            continue
        indices = split_indices.indices
        samples = {
            sample_id: read_sample(
                split_indices.dataset, indices, sample_id, sequence_length, config.extra_tokens, config.pad_id
            )
            for sample_id in sample_ids
            if -len(indices) <= sample_id < len(indices)
        }
        report.append(
            SplitInspection(
                split=split_indices.split,
                sequence_range=(split_indices.description["begin"], split_indices.description["end"]),
                num_tokens_per_epoch=indices.plan.num_tokens_per_epoch,
                num_epochs=indices.plan.num_epochs,
                separate_final_epoch=indices.plan.separate_final_epoch,
                num_samples=len(indices),
                samples=samples,
            )
        )
    return report
