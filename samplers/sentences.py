"""What the sentence-split sample kinds (T5 span corruption, BERT masked LM) share: the per-sample RandomState
and the walk over the splits that loads or builds each split's sample index.

    splits = build_sentence_splits(prefix, "949,50,1", cache_dir, sizes, kind="T5", stem="t5",
                                   description=describe, build_index=build, no_sample="T5 sample")
    for split in splits:   # None, or a SentenceSplit(dataset, name, document_range, sample_index)
        ...
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from .builder import Sizes, default_cache_directory
from .cache import IndexCache
from .errors import EmptySplitError
from .indices import check_index_fits
from .sources import TokenSource
from .splits import SPLIT_NAMES, split_ranges
from .t5.indices import SAMPLE_INDEX_COLUMNS

logger = logging.getLogger(__name__)

SAMPLE_INDEX_KINDS = ("sample_index",)
"""The one array a sentence-split kind caches per split."""
SAMPLE_ROW_BYTES = SAMPLE_INDEX_COLUMNS * np.dtype(np.int64).itemsize
"""Bytes of one sample's row of the index (first sentence, end sentence, target length; int64 each)."""
SEED_MODULUS = 2**32
"""RandomState seeds must be < 2**32; Megatron takes (seed + idx) % 2**32 too."""

# Re-seeding a RandomState costs ~2 us, building one ~200 us (it first seeds itself from the OS):
# each thread keeps one and re-seeds it per sample. Re-seeding gives the stream of RandomState(seed).
_THREAD_STATE = threading.local()


def sample_random_state(seed: int) -> np.random.RandomState:
    """This thread's RandomState, re-seeded with `seed` (a sample's draws: seed + sample id, mod 2**32)."""
    if not hasattr(_THREAD_STATE, "rng"):
        _THREAD_STATE.rng = np.random.RandomState()
    _THREAD_STATE.rng.seed(seed)
    return _THREAD_STATE.rng


@dataclass(frozen=True)
class SentenceSplit:
    """One split's data: what a kind's torch Dataset is built from."""

    dataset: TokenSource
    name: str
    """"train", "valid" or "test"."""
    document_range: tuple[int, int]
    """The split's [begin, end) document ids."""
    sample_index: np.ndarray
    """int64 [n, 3]: first sentence, end sentence, target length of each sample."""


def build_sentence_splits(data_prefix: str, split: str, path_to_cache: Optional[str], sizes: Optional[Sizes], *,
                          kind: str, stem: str,
                          description: Callable[[TokenSource, str, tuple[int, int], Optional[int]], dict],
                          build_index: Callable[[TokenSource, tuple[int, int], Optional[int]], np.ndarray],
                          no_sample: str) -> list[Optional[SentenceSplit]]:
    """Each split's sample index over a sentence-split dataset, loaded from the index cache or built.

    Args:
        data_prefix: the dataset prefix.
        split: split fractions over documents ("949,50,1").
        path_to_cache: index cache directory; None: `index-cache/` beside the dataset.
        sizes: samples wanted per split (None, or a None entry: one epoch).
        kind: the sample kind's name in the log ("T5").
        stem: the kind's part of the cache file names ("t5").
        description: (dataset, split name, document range, size) -> everything that determines the index.
        build_index: (dataset, document range, size) -> int64 [n, 3] sample index.
        no_sample: what the error says the split yields none of ("T5 sample").

    Returns:
        (train, valid, test): None for a split with zero fraction, or no documents and no size.

    Raises:
        EmptySplitError: a split was asked for samples but yields none.
        IndexFormatError: the dataset's files are missing or damaged.
        IndexMemoryError: a split asks for more samples than this machine's available memory can index.
    """
    sizes = tuple(sizes) if sizes is not None else (None,) * len(SPLIT_NAMES)
    dataset = TokenSource(data_prefix)
    cache = IndexCache(path_to_cache or default_cache_directory(data_prefix))
    splits: list[Optional[SentenceSplit]] = []
    for name, document_range, size in zip(SPLIT_NAMES, split_ranges(split, dataset.num_documents), sizes):
        if document_range is None or (document_range[0] == document_range[1] and not size):
            splits.append(None)
            continue
        document_range = tuple(document_range)

        def build(document_range=document_range, size=size, name=name) -> dict[str, np.ndarray]:
            # Whole epochs are walked until `size` samples are reached: the index holds at least that many
            # rows. Refused before the walk, which for a size no memory holds would itself take hours.
            if size:
                check_index_fits(size * SAMPLE_ROW_BYTES, f"{data_prefix} {name}: {size} {kind} samples")
            return {"sample_index": build_index(dataset, document_range, size)}

        file_stem = f"{os.path.basename(dataset.prefix)}-{stem}-{name}"
        sample_index = cache.load_or_build(file_stem, description(dataset, name, document_range, size),
                                           SAMPLE_INDEX_KINDS, build)["sample_index"]
        if size and len(sample_index) == 0:
            raise EmptySplitError(f"{data_prefix}: the {name} split (documents {document_range[0]} to "
                                  f"{document_range[1]}) yields no {no_sample}, but {size} were requested", split=name)
        logger.info("%s %s: documents [%d, %d), %d %s samples", data_prefix, name, *document_range, len(sample_index),
                    kind)
        splits.append(SentenceSplit(dataset, name, document_range, sample_index))
    return splits


class SentenceSampleDataset(torch.utils.data.Dataset):
    """One split of samples drawn from sentence-split documents (`build_sentence_splits`): the dataset, its
    document range, its sample index (one row per sample) and the kind's options; subclasses build items."""

    def __init__(self, dataset: TokenSource, split: str, document_range: tuple[int, int], sample_index: np.ndarray,
                 config) -> None:
        self.dataset = dataset
        self.split = split
        self.document_range = document_range
        self.sample_index = sample_index
        self.config = config

    def __len__(self) -> int:
        return len(self.sample_index)

