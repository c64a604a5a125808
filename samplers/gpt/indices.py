"""The three index arrays of one GPT dataset split, built from sequence lengths alone, and cached.

    spec = GPTIndexSpec(begin=0, end=209, num_samples=4000, sequence_length=128, random_seed=1234)
    arrays = build_gpt_indices(dataset.sequence_lengths, spec)       # pure: lengths in, arrays out
    indices = load_or_build_gpt_indices(dataset, "train", spec, IndexCache("data/index-cache"))

Only `sequence_lengths` (a memory map of the `.idx`, or the lengths of an Arrow / MindRecord dataset) is
read; no token is touched or copied.
"""

from __future__ import annotations

import logging
import os
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, fields
from typing import Iterator, Optional

import numpy as np

from ..cache import IndexCache
from ..errors import EmptySplitError
from ..indices import (
    SEPARATE_FINAL_EPOCH_THRESHOLD,
    build_document_index,
    build_sample_index,
    build_shuffle_index,
    check_index_fits,
    final_epoch_split,
    num_epochs,
    num_samples_in_epochs,
    sample_index_dtype,
    sequence_id_dtype,
    shuffle_index_dtype,
)
from ..sources import TokenSource

logger = logging.getLogger(__name__)

GPT_INDEX_KINDS = ("document_index", "sample_index", "shuffle_index")
CACHE_FORMAT = "tokenmill-gpt-indices-1"
"""Part of every cache description: bump it when the arrays' meaning changes."""
PARTIAL_SAMPLE_RULE = "exact-integer-ceil"
"""How the sample count with a partial last sample is computed (Megatron: float ceil), in the cache key."""


@dataclass
class PhaseTimings:
    """Seconds spent building each kind of index (cache loads are not counted)."""

    document_index: float = 0.0
    sample_index: float = 0.0
    shuffle_index: float = 0.0
    blend_index: float = 0.0

    @contextmanager
    def measure(self, phase: str) -> Iterator[None]:
        """Add the wall time of the with-block to `phase`."""
        start = time.perf_counter()
        try:
            yield
        finally:
            setattr(self, phase, getattr(self, phase) + time.perf_counter() - start)

    def as_dict(self) -> dict[str, float]:
        return {field.name: getattr(self, field.name) for field in fields(self)}


@dataclass(frozen=True, kw_only=True)
class GPTIndexSpec:
    """Everything besides the sequence lengths that determines a split's index arrays."""

    begin: int
    """First sequence id of the split."""
    end: int
    """One past the last sequence id of the split."""
    num_samples: Optional[int]
    """Samples wanted (more may be built, up to the end of the last epoch); None: one epoch."""
    sequence_length: int
    """Tokens per sample L."""
    random_seed: int
    """Seed of the RandomState shared by the document and shuffle indices."""
    extra_tokens: int = 1
    """Tokens read beyond L per sample (0 or 1)."""
    drop_last_partial_sample: bool = True
    """Drop a last sample shorter than L + extra (Megatron keeps it only for validation, on request)."""
    separate_final_epoch_threshold: float = SEPARATE_FINAL_EPOCH_THRESHOLD
    """Fraction of an epoch below which the last epoch is shuffled apart."""


@dataclass(frozen=True)
class EpochPlan:
    """How many epochs a split needs and whether the last is shuffled apart."""

    num_tokens_per_epoch: int
    num_epochs: int
    separate_final_epoch: bool
    num_samples_before_final_epoch: int


@dataclass(frozen=True)
class GPTIndices:
    """A split's index arrays (see `samplers.indices`) and the plan they follow; len() = samples."""

    document_index: np.ndarray
    sample_index: np.ndarray
    shuffle_index: np.ndarray
    plan: EpochPlan

    def __len__(self) -> int:
        return len(self.shuffle_index)


def plan_epochs(sequence_lengths: np.ndarray, spec: GPTIndexSpec) -> EpochPlan:
    """Tokens per epoch, epochs and the final-epoch rule of a split.

    Raises:
        EmptySplitError: the split has no tokens but samples were asked for.
    """
    num_tokens = int(np.sum(sequence_lengths[spec.begin : spec.end], dtype=np.int64))
    if num_tokens == 0:
        if spec.num_samples:
            raise EmptySplitError(
                f"sequences [{spec.begin}, {spec.end}) hold no tokens, but {spec.num_samples} samples were requested"
            )
        return EpochPlan(0, 1, False, 0)
    epochs = num_epochs(num_tokens, spec.num_samples, spec.sequence_length, spec.extra_tokens)
    separate, before_final = final_epoch_split(
        num_tokens, epochs, spec.num_samples, spec.sequence_length, spec.extra_tokens, spec.separate_final_epoch_threshold
    )
    return EpochPlan(num_tokens, epochs, separate, before_final)


def gpt_index_bytes(num_sequences: int, spec: GPTIndexSpec, plan: EpochPlan) -> int:
    """Bytes of the arrays `build_gpt_indices` returns, from their lengths and dtypes, without building them.

    Args:
        num_sequences: sequences S of the whole dataset (chooses the document index dtype).
        spec: the split and sampling parameters.
        plan: the split's epochs (`plan_epochs`).
    """
    positions = plan.num_epochs * (spec.end - spec.begin)
    samples = num_samples_in_epochs(plan.num_epochs * plan.num_tokens_per_epoch, spec.sequence_length,
                                    spec.extra_tokens, spec.drop_last_partial_sample)
    return (positions * sequence_id_dtype(num_sequences).itemsize
            + (samples + 1) * 2 * sample_index_dtype(positions).itemsize
            + samples * shuffle_index_dtype(samples).itemsize)


def build_gpt_indices(
    sequence_lengths: np.ndarray, spec: GPTIndexSpec, timings: Optional[PhaseTimings] = None
) -> dict[str, np.ndarray]:
    """Document, sample and shuffle index of a split, drawing from one RandomState in Megatron's order.

    Args:
        sequence_lengths: int32 [S], tokens per sequence of the whole dataset.
        spec: the split and sampling parameters.
        timings: accumulates the seconds of each phase, if given.

    Returns:
        {"document_index": int32/int64 [E*N], "sample_index": int32/int64 [n+1, 2],
        "shuffle_index": uint32/int64 [n]}.

    Raises:
        EmptySplitError: the split has no tokens but samples were asked for.
    """
    timings = timings if timings is not None else PhaseTimings()
    plan = plan_epochs(sequence_lengths, spec)
    rng = np.random.RandomState(spec.random_seed)
    with timings.measure("document_index"):
        sequence_ids = np.arange(spec.begin, spec.end, dtype=sequence_id_dtype(len(sequence_lengths)))
        document_index = build_document_index(sequence_ids, plan.num_epochs, plan.separate_final_epoch, rng)
    with timings.measure("sample_index"):
        sample_index = build_sample_index(
            sequence_lengths,
            document_index,
            plan.num_epochs * plan.num_tokens_per_epoch,
            spec.sequence_length,
            spec.extra_tokens,
            spec.drop_last_partial_sample,
        )
    with timings.measure("shuffle_index"):
        num_samples = len(sample_index) - 1
        first = plan.num_samples_before_final_epoch if plan.separate_final_epoch else num_samples
        shuffle_index = build_shuffle_index(first, num_samples, rng)
    return {"document_index": document_index, "sample_index": sample_index, "shuffle_index": shuffle_index}


def gpt_index_description(dataset: TokenSource, split_name: str, spec: GPTIndexSpec) -> dict[str, object]:
    """The cache description: dataset fingerprint, split, every spec field and the versioned rules."""
    return {
        "class": "GPTDataset",
        "format": CACHE_FORMAT,
        "partial_sample_rule": PARTIAL_SAMPLE_RULE,
        "dataset": dataset.fingerprint(),
        "split": split_name,
        **asdict(spec),
    }


def load_or_build_gpt_indices(
    dataset: TokenSource,
    split_name: str,
    spec: GPTIndexSpec,
    cache: IndexCache,
    timings: Optional[PhaseTimings] = None,
) -> GPTIndices:
    """A split's indices from the cache, or built (and cached) from the dataset's sequence lengths.

    Args:
        dataset: the low-level dataset; only its lengths and file metadata are read.
        split_name: "train", "valid" or "test" (names the cache files).
        spec: the split and sampling parameters.
        cache: where to look for and store the arrays.
        timings: accumulates the build seconds per phase (nothing is added on a cache hit).

    Raises:
        IndexMemoryError: the arrays to build would not fit in this machine's available memory.
    """
    plan = plan_epochs(dataset.sequence_lengths, spec)
    description = gpt_index_description(dataset, split_name, spec)
    name = f"{os.path.basename(dataset.prefix)}-{split_name}"

    def build() -> dict[str, np.ndarray]:
        asked = f"{spec.num_samples} samples" if spec.num_samples else "one epoch"
        check_index_fits(gpt_index_bytes(len(dataset.sequence_lengths), spec, plan),
                         f"{dataset.prefix} {split_name}: {asked} of {spec.sequence_length} tokens "
                         f"({plan.num_epochs} epochs)")
        return build_gpt_indices(dataset.sequence_lengths, spec, timings)

    arrays = cache.load_or_build(name, description, GPT_INDEX_KINDS, build)
    indices = GPTIndices(plan=plan, **arrays)
    if len(indices) == 0:
        logger.warning("%s %s: fewer tokens than one sample of %d (+%d) tokens: no samples",
                       dataset.prefix, split_name, spec.sequence_length, spec.extra_tokens)
    # A requested size is rounded up to whole epochs: say both numbers, or a user reads the larger as a mistake.
    counted = (f"{len(indices)} samples" if not spec.num_samples
               else f"{spec.num_samples} samples requested, {len(indices)} indexed (whole epochs)")
    logger.info(
        "%s %s: sequences [%d, %d), %d tokens/epoch, %d %s%s, %s",
        dataset.prefix, split_name, spec.begin, spec.end, plan.num_tokens_per_epoch, plan.num_epochs,
        "epoch" if plan.num_epochs == 1 else "epochs", " (last shuffled apart)" if plan.separate_final_epoch else "",
        counted,
    )
    return indices


def read_sample(dataset: TokenSource, indices: GPTIndices, idx: int, sequence_length: int, extra_tokens: int, pad_id: int) -> np.ndarray:
    """Token ids of item `idx` (sample `shuffle_index[idx]`), right-padded with `pad_id` if partial.

    Args:
        dataset: the low-level dataset the indices were built on.
        indices: the split's index arrays.
        idx: item number in [-len, len).
        sequence_length: tokens per sample L.
        extra_tokens: 0 or 1.
        pad_id: id filling a partial last sample.

    Returns:
        int64 [L + extra].

    Raises:
        IndexError: idx is out of range.
    """
    tokens = np.full(sequence_length + extra_tokens, pad_id, dtype=np.int64)
    filled = 0
    for sequence, offset, length in sample_pieces(indices, idx, extra_tokens):
        part = dataset.get(sequence, offset=offset, length=length)
        tokens[filled : filled + len(part)] = part
        filled += len(part)
    return tokens


def sample_pieces(indices: GPTIndices, idx: int, extra_tokens: int) -> list[tuple[int, int, int | None]]:
    """The pieces of sequences item `idx` is made of: (sequence id, first token, tokens or None: to its end).

    Raises:
        IndexError: idx is out of range.
    """
    if not -len(indices) <= idx < len(indices):
        raise IndexError(f"sample {idx} out of range for a split of {len(indices)} samples")
    sample = int(indices.shuffle_index[idx])
    begin_position, begin_offset = (int(v) for v in indices.sample_index[sample])
    end_position, end_offset = (int(v) for v in indices.sample_index[sample + 1])
    pieces = []
    for position in range(begin_position, end_position + 1):
        offset = begin_offset if position == begin_position else 0
        length = end_offset + extra_tokens - offset if position == end_position else None
        pieces.append((int(indices.document_index[position]), offset, length))
    return pieces


def locate_token(dataset: TokenSource, indices: GPTIndices, idx: int, extra_tokens: int, token_id: int) -> str | None:
    """Where item `idx` holds `token_id`: "PATH: document D" (the document's index in the dataset), or None."""
    for sequence, offset, length in sample_pieces(indices, idx, extra_tokens):
        if (dataset.get(sequence, offset=offset, length=length) == token_id).any():
            document = int(np.searchsorted(dataset.document_indices, sequence, side="right")) - 1
            return f"{dataset.prefix}: document {document}"
    return None

