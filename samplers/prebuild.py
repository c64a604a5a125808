"""Build (and cache) a training run's index arrays offline, without torch or a GPU: `build-indices`.

    config = BuildIndicesConfig(data_path=["0.7", "data/a_text_document", "0.3", "data/b_text_document"],
                                split="949,50,1", seq_length=2048, seed=1234, train_samples=10_000_000)
    splits, timings = build_indices(config)      # timings: seconds per phase, cache loads excluded

The cache keys are the ones training computes from the same options, so a run started afterwards
loads these arrays instead of building them. `dump` also copies the arrays into a readable tree.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

from .builder import MidLevelSplit, SplitIndices, build_split_indices
from .cache import save_array
from .config import GPTDatasetConfig
from .errors import BlendFormatError
from .gpt.indices import GPT_INDEX_KINDS, PhaseTimings
from .run_length import RunLength
from .splits import DEFAULT_SPLIT, check_split_sizes, parse_blend


@dataclass(kw_only=True, slots=True)
class BuildIndicesConfig:
    """Options of `build-indices` (Megatron's flag names)."""

    seq_length: int
    """Tokens per sample."""
    data_path: Optional[list[str]] = None
    """Blend words: "P1 P2 ..." or "W1 P1 W2 P2 ..."; exclusive with the per-split paths."""
    train_data_path: Optional[list[str]] = None
    """Blend of the train split, used whole."""
    valid_data_path: Optional[list[str]] = None
    """Blend of the valid split, used whole."""
    test_data_path: Optional[list[str]] = None
    """Blend of the test split, used whole."""
    split: Optional[str] = None
    """Split fractions with `data_path` (default `DEFAULT_SPLIT`, Megatron's)."""
    seed: int = 1234
    """Random seed of the shuffles."""
    train_samples: Optional[int] = None
    """Train samples wanted; None: one epoch."""
    valid_samples: Optional[int] = None
    """Validation samples wanted; None: one epoch."""
    test_samples: Optional[int] = None
    """Test samples wanted; None: one epoch."""
    run_length: Optional[RunLength] = None
    """Take the three sample counts from a run's length, as `train` does (exclusive with the counts)."""
    data_cache_path: Optional[str] = None
    """Index cache directory; None: `index-cache/` beside each dataset."""
    dump: Optional[str] = None
    """Also write every split's arrays under this directory (see `dump_indices`)."""
    timings: bool = False
    """Report the seconds spent building each phase (the CLI prints them as one JSON line)."""

    def __post_init__(self) -> None:
        per_split = (self.train_data_path, self.valid_data_path, self.test_data_path)
        if self.data_path is not None and any(p is not None for p in per_split):
            raise ValueError("data_path excludes train_data_path, valid_data_path and test_data_path")
        if self.data_path is None and all(p is None for p in per_split):
            raise ValueError("data_path (or train/valid/test_data_path) is required")
        if self.data_path is None and self.split is not None:
            raise ValueError("split applies to data_path only; per-split data paths are used whole")
        for name in ("train_samples", "valid_samples", "test_samples"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError(f"{name} must be >= 0, got {value}")
        if self.run_length is not None and any(n is not None for n in self.explicit_sizes):
            raise ValueError("give either the sample counts or the run's length (train iterations ...), not both")
        if self.data_path is not None:
            check_split_sizes(self.split or DEFAULT_SPLIT, self.explicit_sizes)

    @property
    def explicit_sizes(self) -> tuple[Optional[int], Optional[int], Optional[int]]:
        return self.train_samples, self.valid_samples, self.test_samples

    def sizes(self) -> tuple[Optional[int], Optional[int], Optional[int]]:
        """Samples wanted per split: from the run's length when given, else the explicit counts."""
        return self.run_length.sizes() if self.run_length is not None else self.explicit_sizes

    def dataset_config(self) -> GPTDatasetConfig:
        """The `GPTDatasetConfig` training would use for the same options."""
        if self.data_path is not None:
            return GPTDatasetConfig(
                sequence_length=self.seq_length,
                random_seed=self.seed,
                blend=parse_blend(self.data_path),
                split=self.split or DEFAULT_SPLIT,
                path_to_cache=self.data_cache_path,
            )
        paths = (self.train_data_path, self.valid_data_path, self.test_data_path)
        return GPTDatasetConfig(
            sequence_length=self.seq_length,
            random_seed=self.seed,
            blend_per_split=[parse_blend(p) if p is not None else None for p in paths],
            path_to_cache=self.data_cache_path,
        )


def _dump_mid_level(split: MidLevelSplit, directory: str) -> None:
    os.makedirs(directory, exist_ok=True)
    for kind in GPT_INDEX_KINDS:
        save_array(os.path.join(directory, f"{kind}.npy"), getattr(split.indices, kind))


def dump_indices(splits: list[Optional[SplitIndices]], directory: str) -> None:
    """Write `directory/{split}/document_index.npy, sample_index.npy, shuffle_index.npy`; for a blend
    `directory/{split}/dataset_index.npy, dataset_sample_index.npy` and each member's three arrays in
    `directory/{split}/{member prefix basename}/`.

    Raises:
        BlendFormatError: two members of a blend share a basename (their arrays would collide).
    """
    for split in splits:
        if split is None:
            continue
        split_directory = os.path.join(directory, split.split)
        if isinstance(split, MidLevelSplit):
            _dump_mid_level(split, split_directory)
            continue
        members = [member for member in split.members if member is not None]
        basenames = [os.path.basename(member.dataset.prefix) for member in members]
        if len(set(basenames)) != len(basenames):
            raise BlendFormatError(f"cannot dump the {split.split} blend: members share a basename ({basenames})")
        os.makedirs(split_directory, exist_ok=True)
        for kind in ("dataset_index", "dataset_sample_index"):
            save_array(os.path.join(split_directory, f"{kind}.npy"), getattr(split, kind))
        for member, basename in zip(members, basenames):
            _dump_mid_level(member, os.path.join(split_directory, basename))


def build_indices(config: BuildIndicesConfig) -> tuple[list[Optional[SplitIndices]], PhaseTimings]:
    """Build or load every split's indices (cached), optionally dump them.

    Returns:
        (the three splits as `build_split_indices` returns them, build seconds per phase).

    Raises:
        TokenmillError: see `builder.build_split_indices` and `dump_indices`.
    """
    timings = PhaseTimings()
    splits = build_split_indices(config.dataset_config(), config.sizes(), timings)
    if config.dump is not None:
        dump_indices(splits, config.dump)
    return splits, timings
