"""Batches for the trainer: the samplers room's GPT datasets, read ahead by a background thread.

Only the data-parallel rank decides which samples a process reads (`DataParallelSampler`); tensor
and pipeline peers read the same ones. A step's batch is ``num_microbatches`` micro-batches of
``micro_batch_size`` samples, collated and checked against the vocabulary off the training thread,
so the step only pays for a queue ``get``.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

from indexed_dataset import TokenmillError, data_file_path, format_of, index_file_path
from samplers import DataParallelSampler, GPTDatasetConfig, build_gpt_datasets
from samplers.errors import EmptySplitError
from samplers.run_length import EVAL_ITERS_FLAG, RunLength
from trainer.config import DataConfig
from trainer.errors import TrainConfigError

# Labels with this value are left out of the loss (``F.cross_entropy``'s default ignore_index).
IGNORE_INDEX = -100
# Steps read ahead; two keep the queue full while a step runs without holding much memory.
PREFETCH_STEPS = 2


@dataclass(slots=True)
class MicroBatch:
    """One micro-batch: tokens, position_ids and loss targets, each int64 [micro_batch_size, seq]."""

    tokens: torch.Tensor
    position_ids: torch.Tensor
    targets: torch.Tensor
    """Labels with IGNORE_INDEX where the loss mask is 0."""

    def to(self, device: torch.device) -> MicroBatch:
        return MicroBatch(*(t.to(device, non_blocking=True) for t in (self.tokens, self.position_ids, self.targets)))


@dataclass(frozen=True, slots=True)
class Vocabulary:
    """What the trainer needs from the tokenizer."""

    size: int
    """Unpadded vocabulary size."""
    eod_id: int | None
    pad_id: int | None


def resolve_vocabulary(data: DataConfig, vocab_size: int | None) -> Vocabulary:
    """The vocabulary size (an explicit ``vocab_size`` wins) and EOD/pad ids from the tokenizer files.

    Raises:
        TrainConfigError: neither a vocabulary size nor tokenizer files are given.
    """
    files = {name: getattr(data, name) for name in ("vocab_file", "merge_file", "tokenizer_model")
             if getattr(data, name) is not None}
    if not files:
        if vocab_size is None:
            raise TrainConfigError("the vocabulary size is unknown: give vocab_size or the tokenizer's vocab_file")
        return Vocabulary(size=vocab_size, eod_id=None, pad_id=None)
    # Imported here: the tokenizer libraries load only when a run names tokenizer files.
    from preprocess.tokenizers import TokenizerConfig, build_tokenizer

    try:
        tokenizer = build_tokenizer(TokenizerConfig(tokenizer_type=data.tokenizer_type, **files))
    except ValueError as error:
        raise TrainConfigError(str(error)) from error
    return Vocabulary(size=vocab_size or tokenizer.vocab_size, eod_id=tokenizer.eod, pad_id=tokenizer.pad)


def check_data_files(data: DataConfig) -> tuple[list[str], list[float] | None]:
    """The blend's datasets and weights, after checking that each one's files exist.

    A dataset is any format tokenmill writes: an mmap prefix (its ``.bin`` and ``.idx``), an Arrow
    ``save_to_disk`` folder or ``.arrow`` file, or a ``.mindrecord`` file.

    Raises:
        TrainConfigError: no data given, or a file is missing.
    """
    prefixes, weights = data.blend
    for prefix in prefixes:
        try:
            is_mmap = format_of(prefix) == "mmap"
        except TokenmillError as error:
            raise TrainConfigError(f"dataset {error}") from None
        for path in (data_file_path(prefix), index_file_path(prefix)) if is_mmap else (prefix,):
            if not Path(path).exists():
                raise TrainConfigError(f"dataset {prefix}: {path} not found")
    return prefixes, weights


@contextmanager
def explained_sample_counts(run: RunLength, split: str) -> Iterator[None]:
    """Turn a split asked for more samples than it can give into one line naming the flags behind the count.

    Args:
        run: where the sample counts came from.
        split: the run's ``--split`` string, quoted in the advice.

    Raises:
        TrainConfigError: the samplers' EmptySplitError, explained.
    """
    try:
        yield
    except EmptySplitError as error:
        if error.split is None:
            raise TrainConfigError(str(error)) from None
        if error.split == "train":
            advice = f"give the train split a share of the data with --split (now {split})"
        else:
            advice = (f"give the {error.split} split a share of the data with --split (now {split}; a small "
                      f"dataset may need e.g. 90,5,5), or set {EVAL_ITERS_FLAG} 0 to skip evaluation")
        raise TrainConfigError(f"{error} ({run.explain(error.split)}); {advice}") from None


def build_datasets(data: DataConfig, seq_length: int, vocabulary: Vocabulary, sizes: tuple[int, int, int]):
    """The train, valid and test datasets (each None when empty and not asked for).

    Args:
        data: data settings.
        seq_length: tokens per sample.
        vocabulary: EOD and pad ids.
        sizes: samples wanted per split.

    Raises:
        TrainConfigError: a prefix has no ``.bin``/``.idx`` or the split/blend is malformed.
    """
    prefixes, weights = check_data_files(data)
    options = {"pad_id": vocabulary.pad_id} if vocabulary.pad_id is not None else {}
    try:
        config = GPTDatasetConfig(sequence_length=seq_length, random_seed=data.seed, blend=(prefixes, weights),
                                  split=data.split, path_to_cache=data.data_cache_path, eod_id=vocabulary.eod_id,
                                  **options)
    except ValueError as error:
        raise TrainConfigError(str(error)) from error
    return build_gpt_datasets(config, sizes=sizes)


def step_iterator(dataset, consumed_samples: int, micro_batch_size: int, num_microbatches: int, dp_rank: int,
                  dp: int, vocab_size: int, collate_fn: Callable | None = None) -> Iterator[list]:
    """This dp rank's micro-batches, one list per optimiser step, from ``consumed_samples`` on.

    ``collate_fn(items, vocab_size)`` stacks a micro-batch's items (default: GPT's `collate`;
    T5 passes `trainer.models.t5.data.collate_t5`).
    """
    sampler = DataParallelSampler(total_samples=len(dataset), consumed_samples=consumed_samples,
                                  micro_batch_size=micro_batch_size, data_parallel_rank=dp_rank,
                                  data_parallel_size=dp)
    return step_batches(dataset, sampler, num_microbatches, vocab_size, collate_fn or collate)


def check_token_ids(vocab_size: int, *ids: torch.Tensor) -> None:
    """Every id of a micro-batch lies in [0, vocab_size): an id outside would index past the embedding.

    Checked per micro-batch (one vectorised min and max), not by scanning whole token files at start-up:
    the check reads only the tokens training uses, and costs nothing on a multi-terabyte int32 corpus.

    Raises:
        TrainConfigError: a negative id (a signed token file that is damaged or not token ids), or one at
            or above vocab_size.
    """
    smallest = min(int(tensor.min()) for tensor in ids)
    if smallest < 0:
        raise TrainConfigError(f"the data holds token id {smallest}, but token ids are >= 0 (a signed token "
                               "file holding negative values: damaged, or not token ids)")
    largest = max(int(tensor.max()) for tensor in ids)
    if largest >= vocab_size:
        raise TrainConfigError(f"the data holds token id {largest} but vocab_size is {vocab_size}")


def collate(items: list[dict[str, torch.Tensor]], vocab_size: int) -> MicroBatch:
    """Stack samplers' items into a `MicroBatch`.

    Raises:
        TrainConfigError: a token id does not fit the model's vocabulary.
    """
    tokens = torch.stack([item["tokens"] for item in items]).long()
    labels = torch.stack([item["labels"] for item in items]).long()
    loss_mask = torch.stack([item["loss_mask"] for item in items])
    check_token_ids(vocab_size, tokens, labels)
    targets = labels.masked_fill(loss_mask == 0, IGNORE_INDEX)
    position_ids = torch.stack([item["position_ids"] for item in items]).long()
    return MicroBatch(tokens=tokens, position_ids=position_ids, targets=targets)


def step_batches(dataset, sampler, num_microbatches: int, vocab_size: int, collate_fn: Callable) -> Iterator[list]:
    """Yield each step's micro-batches, in the sampler's order, stacked by ``collate_fn(items, vocab_size)``."""
    step: list = []
    for indices in sampler:
        step.append(collate_fn([dataset[i] for i in indices], vocab_size))
        if len(step) == num_microbatches:
            yield step
            step = []


class Prefetcher:
    """Runs an iterator in a daemon thread, ``PREFETCH_STEPS`` items ahead; errors re-raise in ``next``."""

    _DONE = object()

    def __init__(self, iterator: Iterator) -> None:
        self._queue: queue.Queue = queue.Queue(maxsize=PREFETCH_STEPS)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(iterator,), daemon=True, name="prefetch")
        self._thread.start()

    def _run(self, iterator: Iterator) -> None:
        try:
            for item in iterator:
                if not self._put(item):
                    return
        except Exception as error:  # handed to the training thread, which re-raises it
            self._put(error)
            return
        self._put(self._DONE)

    def _put(self, item: object) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def __iter__(self) -> Prefetcher:
        return self

    def __next__(self):
        item = self._queue.get()
        if item is self._DONE:
            raise StopIteration
        if isinstance(item, Exception):
            raise item
        return item

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
