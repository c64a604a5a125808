"""Batches for the trainer, for any model family: vocabulary, data files, the data-parallel order of a
family's datasets, read ahead by a background thread.

Only the data-parallel rank decides which samples a process reads (`DataParallelSampler`); tensor
and pipeline peers read the same ones. A step's batch is ``num_microbatches`` micro-batches of
``micro_batch_size`` samples, collated and checked against the vocabulary off the training thread,
so the step only pays for a queue ``get``.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch
import torch.nn.functional as F

from indexed_dataset import TokenmillError, data_file_path, format_of, index_file_path
from indexed_dataset.names import first_data_file
from samplers import DataParallelSampler
from samplers.errors import EmptySplitError
from samplers.run_length import EVAL_ITERS_FLAG, RunLength
from trainer.config import DataConfig
from trainer.errors import TrainConfigError

logger = logging.getLogger(__name__)

# Labels with this value are left out of the loss (``F.cross_entropy``'s default ignore_index).
IGNORE_INDEX = -100
# Steps read ahead; two keep the queue full while a step runs without holding much memory.
PREFETCH_STEPS = 2
# Seconds `Prefetcher.close` waits for its thread. The thread stops within one put timeout (0.1 s) once told,
# but a run unwinding from Ctrl-C or SIGTERM must never wait on it without bound: it is a daemon, so the
# process ends whether or not it has.
PREFETCH_CLOSE_TIMEOUT_S = 5.0
# The item key under which `step_batches` gives a collate function each sample's id (int64 scalar tensor).
SAMPLE_ID_KEY = "sample_id"


def to_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``tensor`` on ``device``, the copy queued without waiting for the device: CUDA copies a pinned host
    tensor asynchronously, while a copy from pageable memory first waits for every kernel already queued (a
    host sync at the start of each step)."""
    if device.type == "cuda" and tensor.device.type == "cpu" and not tensor.is_pinned():
        tensor = tensor.pin_memory()
    return tensor.to(device, non_blocking=True)


class MicroBatch(Protocol):
    """What the core reads of a family's micro-batch (a dataclass of the family's, in its ``data`` module):
    its loss targets and sample ids; the model's inputs are the family's
    (`trainer.parallel.plan.ParallelPlan.model_inputs`)."""

    targets: torch.Tensor
    """int64 [micro_batch_size, seq]: labels, IGNORE_INDEX where no loss is taken."""
    sample_ids: torch.Tensor | None
    """int64 [micro_batch_size]: each sample's id in the run's global sample order (`stack_sample_ids`; what
    keyed dropout is keyed by), None for items that did not come through `step_batches`."""

    def to(self, device: torch.device) -> MicroBatch:
        """The micro-batch on ``device``."""


@dataclass(frozen=True, slots=True)
class Vocabulary:
    """What the trainer needs from the tokenizer."""

    size: int
    """Unpadded vocabulary size."""
    eod_id: int | None
    pad_id: int | None


def resolve_vocabulary(data: DataConfig, vocab_size: int | None) -> Vocabulary:
    """The vocabulary size (an explicit ``vocab_size`` wins) and EOD/pad ids from the tokenizer files (a
    NullTokenizer's from ``vocab_size``: EOD its last id, no pad, as Megatron's).

    Raises:
        TrainConfigError: neither a vocabulary size nor tokenizer files are given, or the tokenizer has more
            ids than an explicit ``vocab_size``.
    """
    files = {name: getattr(data, name) for name in ("vocab_file", "merge_file", "tokenizer_model")
             if getattr(data, name) is not None}
    if not files:
        if vocab_size is None:
            raise TrainConfigError("the vocabulary size is unknown: give vocab_size or the tokenizer's vocab_file")
        if data.tokenizer_type != "NullTokenizer":
            return Vocabulary(size=vocab_size, eod_id=None, pad_id=None)
        # Megatron's NullTokenizer is made of the vocabulary size alone (its EOD is the last id).
        files = {"vocab_size": vocab_size}
    # Imported here: the tokenizer libraries load only when a run names tokenizer files.
    from preprocess.tokenizers import TokenizerConfig, build_tokenizer

    try:
        tokenizer = build_tokenizer(TokenizerConfig(tokenizer_type=data.tokenizer_type, **files))
    except ValueError as error:
        raise TrainConfigError(str(error)) from error
    if vocab_size is not None and tokenizer.vocab_size > vocab_size:
        # A --load-hf model (or --vocab-size) smaller than the tokenizer: its ids past the model's rows
        # would be refused mid-run, or silently trained on padding rows.
        raise TrainConfigError(f"the tokenizer {data.tokenizer_model or data.vocab_file} has {tokenizer.vocab_size} "
                               f"ids but the model's vocab_size is {vocab_size}: its ids do not fit the model")
    return Vocabulary(size=vocab_size or tokenizer.vocab_size, eod_id=tokenizer.eod, pad_id=tokenizer.pad)


def check_data_files(data: DataConfig) -> None:
    """Check that the files of every dataset of the run exist: the blend's, or every split's blend with
    per-split data paths.

    A dataset is any format tokenmill writes: an mmap prefix (its ``.bin`` and ``.idx``), an Arrow
    ``save_to_disk`` folder or ``.arrow`` file, or a ``.mindrecord`` file.

    Raises:
        TrainConfigError: no data given, or a file is missing (one line naming it).
    """
    if data.mock_data:  # synthetic tokens: no files
        return
    blends = data.blend_per_split if data.blend_per_split is not None else [data.blend]
    for prefix in (prefix for blend in blends if blend is not None for prefix in blend[0]):
        try:
            is_mmap = format_of(prefix) == "mmap"
        except TokenmillError as error:
            raise TrainConfigError(f"dataset {error}") from None
        # A multi-shard MindRecord is named `x.mindrecord` (its files are `x.mindrecord0..N-1`).
        files = (data_file_path(prefix), index_file_path(prefix)) if is_mmap else (first_data_file(prefix),)
        for path in files:
            if not Path(path).exists():
                raise TrainConfigError(f"dataset {prefix}: {path} not found")


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


def step_iterator(dataset, consumed_samples: int, micro_batch_size: int, num_microbatches: int, dp_rank: int,
                  dp: int, vocab_size: int, collate_fn: Callable,
                  batch_sizes: Callable[[int], int] | None = None) -> Iterator[list]:
    """This dp rank's micro-batches, one list per optimiser step, from ``consumed_samples`` on.

    ``collate_fn(items, vocab_size)`` stacks a micro-batch's items (the family's
    `trainer.family.spec.TrainingParts.collate`). ``batch_sizes`` (a batch-size ramp, `TrainConfig.
    batch_size_schedule`): consumed samples -> the next step's global batch, which sets that step's micro-batch
    count instead of ``num_microbatches``; the samples stay in the global order, as Megatron's sampler reads them.
    """
    sampler = DataParallelSampler(total_samples=len(dataset), consumed_samples=consumed_samples,
                                  micro_batch_size=micro_batch_size, data_parallel_rank=dp_rank,
                                  data_parallel_size=dp)
    if batch_sizes is None:
        return step_batches(dataset, sampler, num_microbatches, vocab_size, collate_fn)
    return _varying_steps(step_batches(dataset, sampler, 1, vocab_size, collate_fn), consumed_samples,
                          micro_batch_size * dp, batch_sizes)


def _varying_steps(single_microbatches: Iterator[list], consumed_samples: int, samples_per_microbatch: int,
                   batch_sizes: Callable[[int], int]) -> Iterator[list]:
    """Group one-micro-batch steps into steps of ``batch_sizes(consumed) // samples_per_microbatch`` each."""
    while True:
        count = batch_sizes(consumed_samples) // samples_per_microbatch
        step = [microbatch for _, (microbatch,) in zip(range(count), single_microbatches)]
        if len(step) < count:
            return
        consumed_samples += count * samples_per_microbatch
        yield step


def token_cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over the tokens of a micro-batch whose target is not IGNORE_INDEX (float32).

    Args:
        logits: [batch, seq, vocab] (under tensor parallelism a DTensor sharded over the vocabulary,
            inside ``loss_parallel``).
        targets: int64 [batch, seq].
    """
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), ignore_index=IGNORE_INDEX)


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
        raise TokenIdError(smallest, f"the data holds token id {smallest}, but token ids are >= 0 (a signed token "
                                     "file holding negative values: damaged, or not token ids)")
    largest = max(int(tensor.max()) for tensor in ids)
    if largest >= vocab_size:
        raise TokenIdError(largest, f"the data holds token id {largest} but vocab_size is {vocab_size}")


class TokenIdError(TrainConfigError):
    """A token id outside the vocabulary; `token_id` lets the caller find the file and document holding it."""

    def __init__(self, token_id: int, message: str) -> None:
        super().__init__(message)
        self.token_id = token_id


def _located(error: TokenIdError, dataset, indices: list[int]) -> TrainConfigError:
    """`error` with the dataset file and document that hold its id appended, when the dataset can say
    (`locate_token` of the GPT datasets); the id is searched only now, after the cheap check failed."""
    locate = getattr(dataset, "locate_token", None)
    places = (locate(i, error.token_id) for i in indices) if locate is not None else ()
    place = next((place for place in places if place is not None), None)
    return TrainConfigError(f"{error} (in {place})") if place is not None else error


def step_batches(dataset, sampler, num_microbatches: int, vocab_size: int, collate_fn: Callable) -> Iterator[list]:
    """Yield each step's micro-batches, in the sampler's order, stacked by ``collate_fn(items, vocab_size)``."""
    step: list = []
    for indices in sampler:
        # The trainer's sampler reads the global order in sequence, so an id is never read twice in a run.
        items = [{**dataset[i], SAMPLE_ID_KEY: torch.tensor(i, dtype=torch.int64)} for i in indices]
        try:
            step.append(collate_fn(items, vocab_size))
        except TokenIdError as error:
            raise _located(error, dataset, indices) from None
        if len(step) == num_microbatches:
            yield step
            step = []


def stack_sample_ids(items: list[dict[str, torch.Tensor]]) -> torch.Tensor | None:
    """int64 [len(items)]: the sample ids `step_batches` put in the items; None when an item has none."""
    if not all(SAMPLE_ID_KEY in item for item in items):
        return None
    return torch.stack([item[SAMPLE_ID_KEY] for item in items])


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
        """Stop the thread and wait for it, at most `PREFETCH_CLOSE_TIMEOUT_S` seconds."""
        self._stop.set()
        self._thread.join(PREFETCH_CLOSE_TIMEOUT_S)
        if self._thread.is_alive():
            logger.warning("the batch prefetch thread did not stop within %.0f s; leaving it (a daemon) behind",
                           PREFETCH_CLOSE_TIMEOUT_S)
