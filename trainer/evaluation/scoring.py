"""Teacher-forced scoring of token rows with a GPT split over tp x pp x dp processes.

Every evaluation (LAMBADA, perplexity windows, lm-eval's requests) is a list of `ScoreRow`s: a token
sequence and the range of its next-token targets that counts. `score_rows` runs them in right-padded
batches through this rank's `trainer.models.gpt.sharded.ShardedGPT` (the rows split round-robin over the
data-parallel replicas) and gives every rank every row's `RowScore`.

    with open_eval_model(EvalModelConfig(load="gpt2/")) as model:
        scores = score_rows(model, [ScoreRow(np.array([464, 2068, 7586]), first=0, last=2)], "example")
        scores[0].log_prob, scores[0].greedy
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import torch
import torch.distributed as dist
from tqdm import tqdm

from indexed_dataset.errors import TokenmillError
from preprocess.tokenizers import Tokenizer, TokenizerConfig, build_tokenizer
from trainer.distributed import init_distributed, resolve_device_type
from trainer.errors import TrainConfigError
from trainer.hf_files import tokenizer_config_for_directory
from trainer.models import spec_for_source
from trainer.models.gpt.generate import _load_weights, _resolve_source
from trainer.models.gpt.sharded import ShardedGPT, sharded_layout

logger = logging.getLogger(__name__)
T = TypeVar("T")

# Families whose checkpoints `evaluate` scores (through ShardedGPT); others get one line saying so.
SCORED_FAMILIES = ("gpt",)
# Id written into the right padding of a batch: causal attention keeps it out of every real position.
PAD_TOKEN_ID = 0


class EvalDataError(TokenmillError, ValueError):
    """An evaluation data file is unreadable or malformed; the message names the file (and line)."""


@dataclass(kw_only=True, slots=True)
class EvalModelConfig:
    """The model of an evaluation run and how it is split."""

    load: str
    """A tokenmill checkpoint (root or iter_XXXXXXX directory) or a local HF GPT-2 directory."""
    no_verify: bool = False
    """Load without checking the checkpoint's files against its manifest."""
    tokenizer: TokenizerConfig | None = None
    """Default: the tokenizer files stored with the model, if any."""
    batch_size: int = 8
    """Rows per forward pass on one data-parallel replica."""
    tensor_model_parallel_size: int = 1
    pipeline_model_parallel_size: int = 1
    device: str | None = None
    """cpu or cuda; default cuda when available."""
    progress: bool = True
    """Show a progress bar (global rank 0, on stderr)."""

    def __post_init__(self) -> None:
        for name in ("batch_size", "tensor_model_parallel_size", "pipeline_model_parallel_size"):
            if getattr(self, name) < 1:
                raise TrainConfigError(f"{name} must be positive, got {getattr(self, name)}")


@dataclass(frozen=True, slots=True)
class ScoreRow:
    """One sequence to score: inputs ``ids[:-1]`` predict targets ``ids[1:]``; targets ``[first, last)``
    count (target ``t`` is ``ids[t + 1]``, predicted from ``ids[:t + 1]``)."""

    ids: np.ndarray
    """int64 [n + 1] token ids."""
    first: int
    last: int


@dataclass(frozen=True, slots=True)
class RowScore:
    """A row's scored targets, summed."""

    log_prob: float
    """Sum of their log-probabilities (natural log, accumulated in float64)."""
    greedy: bool
    """Every one is the model's argmax choice."""
    count: int
    """How many targets were scored."""


@dataclass(slots=True)
class EvalModel:
    """This rank's part of the model, with what the tasks need to know about it."""

    sharded: ShardedGPT
    tokenizer: Tokenizer | None
    vocab_size: int
    max_positions: int
    eod_id: int | None
    dp: int
    progress: bool
    batch_size: int

    def require_tokenizer(self, what: str) -> Tokenizer:
        """The tokenizer, or one clear error naming ``what`` needs it."""
        if self.tokenizer is None:
            raise TrainConfigError(f"{what} needs a tokenizer: the model holds no tokenizer files; give the "
                                   "tokenizer options")
        return self.tokenizer


def check_family(load: str) -> None:
    """Raise unless ``load`` is a model family that evaluation scores.

    Raises:
        TrainConfigError: naming the family.
    """
    family = spec_for_source(load).name
    if family not in SCORED_FAMILIES:
        raise TrainConfigError(f"{load} is a {family} model; evaluation scores {', '.join(SCORED_FAMILIES)} "
                               "models only")


@contextmanager
def open_eval_model(config: EvalModelConfig) -> Iterator[EvalModel]:
    """Join (or create) the process group, build and load this rank's part of the model; the group this
    made is destroyed on exit. Collective: every process of the group enters it.

    Raises:
        TokenmillError: the model, tokenizer or layout is wrong (one clear message, before any collective).
    """
    check_family(config.load)
    device_type = resolve_device_type(config.device)
    ctx = init_distributed(device_type)
    try:
        source = _resolve_source(config.load, config.tensor_model_parallel_size)
        layout = sharded_layout(source.shape, config.tensor_model_parallel_size, config.pipeline_model_parallel_size,
                                ctx.world_size)
        tokenizer_config = config.tokenizer or tokenizer_config_for_directory(source.directory)
        tokenizer = build_tokenizer(tokenizer_config) if tokenizer_config is not None else None
        sharded = ShardedGPT(source.shape, source.vocab_size, layout, layout.build_mesh(device_type), ctx.device)
        _load_weights(sharded, source, verify=not config.no_verify)
        sharded.finish_loading()
        logger.info("evaluating with tp %d, pp %d, dp %d", layout.tp, layout.pp, layout.dp)
        yield EvalModel(sharded=sharded, tokenizer=tokenizer, vocab_size=source.vocab_size,
                        max_positions=source.shape.max_position_embeddings,
                        eod_id=tokenizer.eod if tokenizer is not None else source.eod_id, dp=layout.dp,
                        progress=config.progress and ctx.rank == 0, batch_size=config.batch_size)
    finally:
        if ctx.owns_process_group:
            dist.destroy_process_group()


def check_rows(model: EvalModel, rows: list[ScoreRow], where: str) -> None:
    """Every row fits the model's positions and vocabulary.

    Raises:
        EvalDataError: naming ``where`` and the row.
    """
    for index, row in enumerate(rows):
        if len(row.ids) - 1 > model.max_positions:
            raise EvalDataError(f"{where}: row {index} needs {len(row.ids) - 1} positions, the model has "
                                f"{model.max_positions}")
        if len(row.ids) and (row.ids.min() < 0 or row.ids.max() >= model.vocab_size):
            raise EvalDataError(f"{where}: row {index} holds a token id outside [0, {model.vocab_size}) (the "
                                "model's vocabulary)")


def _batch(rows: list[ScoreRow], device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded inputs, positions and targets, each int64 [rows, longest - 1]."""
    width = max(len(row.ids) for row in rows) - 1
    table = np.full((len(rows), width + 1), PAD_TOKEN_ID, dtype=np.int64)
    for index, row in enumerate(rows):
        table[index, :len(row.ids)] = row.ids
    table = torch.from_numpy(table).to(device)
    positions = torch.arange(width, device=device).expand(len(rows), width)
    return table[:, :-1], positions, table[:, 1:]


def map_over_dp(model: EvalModel, count: int, run_batch: Callable[[list[int]], list[T]], desc: str) -> list[T]:
    """Run items ``0..count-1`` in batches, each data-parallel replica taking every dp-th item, and gather
    every result on every rank (collective over every process of the run).

    Args:
        run_batch: this replica's item indices (at most ``batch_size``) -> one result each, in order
            (collective over the replica's tp and pp ranks).
        desc: the progress bar's label.
    """
    sharded = model.sharded
    mine = list(range(sharded.dp_rank, count, model.dp))
    results: dict[int, T] = {}
    starts = range(0, len(mine), model.batch_size)
    for start in tqdm(starts, desc=desc, unit="batch", disable=not model.progress, dynamic_ncols=True):
        batch = mine[start:start + model.batch_size]
        results |= dict(zip(batch, run_batch(batch)))
    if sharded.dp_group is not None:
        gathered: list[dict[int, T]] = [{} for _ in range(model.dp)]
        dist.all_gather_object(gathered, results, group=sharded.dp_group)
        results = {k: v for part in gathered for k, v in part.items()}
    return [results[i] for i in range(count)]


def _score_batch(model: EvalModel, rows: list[ScoreRow], greedy: bool) -> list[RowScore]:
    tokens, positions, targets = _batch(rows, model.sharded.device)
    log_probs, hits = model.sharded.score(tokens, positions, targets, greedy)
    log_probs, hits = log_probs.double().cpu(), hits.cpu()
    return [RowScore(log_prob=float(log_probs[slot, row.first:row.last].sum()),
                     greedy=bool(hits[slot, row.first:row.last].all()), count=row.last - row.first)
            for slot, row in enumerate(rows)]


def score_rows(model: EvalModel, rows: list[ScoreRow], where: str, greedy: bool = True) -> list[RowScore]:
    """Score ``rows`` (collective over every process of the run; each data-parallel replica takes every
    dp-th row).

    Args:
        where: what the rows come from (a file name), for errors.
        greedy: find whether each target is the argmax (else every ``RowScore.greedy`` is False).

    Returns:
        One `RowScore` per row, in order, on every rank.

    Raises:
        EvalDataError: a row does not fit the model (raised on every rank, before any collective).
    """
    check_rows(model, rows, where)
    return map_over_dp(model, len(rows), lambda batch: _score_batch(model, [rows[i] for i in batch], greedy),
                       "scoring")
