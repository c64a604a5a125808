"""Teacher-forced scoring of token rows with a model split over tp x pp x dp processes.

Every evaluation (LAMBADA, perplexity windows, lm-eval's requests) is a list of `ScoreRow`s: a token
sequence and the range of its next-token targets that counts. `score_rows` runs them in right-padded
batches through this rank's part of the model (the rows split round-robin over the data-parallel
replicas; the head applied to the counted positions only) and gives every rank every row's `RowScore`.
A family is evaluated when its `ModelSpec.scoring_source` gives a `ScoringSource`; the registry finds it
(`trainer.models.dispatch.resolve_scoring_source`), so this module never names a family.

    with open_eval_model(EvalModelConfig(load="gpt2/"), resolve_scoring_source("gpt2/", 1)) as model:
        scores = score_rows(model, [ScoreRow(np.array([464, 2068, 7586]), first=0, last=2)], "example")
        scores[0].log_prob, scores[0].greedy
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TypeVar

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup

from indexed_dataset.errors import TokenmillError
from preprocess.tokenizers import Tokenizer, TokenizerConfig, build_tokenizer
from trainer.parallel.distributed import init_distributed, resolve_device_type
from trainer.errors import TrainConfigError
from trainer.generation.layout import GenerationLayout
from trainer.generation.replicas import map_over_replicas
from trainer.generation.sampling import SamplingConfig
from trainer.checkpoint.hf_files import tokenizer_config_for_directory

logger = logging.getLogger(__name__)
T = TypeVar("T")

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


class ScoringModel(Protocol):
    """This rank's part of a model split for scoring (`trainer.models.gpt.sharded.ShardedGPT`)."""

    device: torch.device
    dp_rank: int
    dp_group: ProcessGroup | None

    def score(self, tokens: torch.Tensor, positions: torch.Tensor, targets: torch.Tensor, scored: torch.Tensor,
              greedy: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """int64 [batch, n] inputs, positions and targets, bool [batch, n] the counted positions -> float32
        log-probabilities and bool greedy hits of the counted positions, each [counted], in row-major order
        (collective over the replica's tp and pp ranks)."""


class ScoringSource(Protocol):
    """A checkpoint or HF directory resolved for scoring (a family's `ModelSpec.scoring_source`)."""

    directory: Path
    """Where the tokenizer files stored with the model are looked for."""
    vocab_size: int
    eod_id: int | None

    @property
    def max_positions(self) -> int:
        """Positions the model embeds."""

    def layout(self, tp: int, pp: int, world_size: int) -> GenerationLayout:
        """The checked layout (raises `TrainConfigError` naming a size that does not divide)."""

    def open_sharded(self, layout: GenerationLayout, device_type: str, device: torch.device, verify: bool
                     ) -> ScoringModel:
        """This rank's part of the model, loaded (collective over the process group)."""

    def generate_ids(self, model: ScoringModel, prompts: list[list[int]], max_new_tokens: int,
                     sampling: SamplingConfig, eod_id: int | None, generator: torch.Generator | None
                     ) -> list[list[int]]:
        """Continue one batch of prompts with ``model`` (what `open_sharded` gave): each prompt's generated ids,
        ending with ``eod_id`` when it stopped there (lm-eval's ``generate_until``; collective over the
        model's tp/pp ranks)."""


@dataclass(slots=True)
class EvalModel:
    """This rank's part of the model, with what the tasks need to know about it."""

    sharded: ScoringModel
    source: ScoringSource
    """What the model was loaded from (its family's `ScoringSource`: generation with ``sharded``)."""
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


@contextmanager
def open_eval_model(config: EvalModelConfig, source: ScoringSource) -> Iterator[EvalModel]:
    """Join (or create) the process group, build and load this rank's part of the model; the group this
    made is destroyed on exit. Collective: every process of the group enters it. ``source`` is
    ``config.load`` as its family scores it (`trainer.models.dispatch.resolve_scoring_source`).

    Raises:
        TokenmillError: the model, tokenizer or layout is wrong (one clear message, before any collective).
    """
    device_type = resolve_device_type(config.device)
    ctx = init_distributed(device_type)
    try:
        layout = source.layout(config.tensor_model_parallel_size, config.pipeline_model_parallel_size, ctx.world_size)
        tokenizer_config = config.tokenizer or tokenizer_config_for_directory(source.directory)
        tokenizer = build_tokenizer(tokenizer_config) if tokenizer_config is not None else None
        sharded = source.open_sharded(layout, device_type, ctx.device, verify=not config.no_verify)
        logger.info("evaluating with tp %d, pp %d, dp %d", layout.tp, layout.pp, layout.dp)
        yield EvalModel(sharded=sharded, source=source, tokenizer=tokenizer, vocab_size=source.vocab_size,
                        max_positions=source.max_positions,
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


def _batch(rows: list[ScoreRow], device: torch.device
           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded inputs, positions and targets, each int64 [rows, longest - 1], and the counted
    targets, bool [rows, longest - 1]."""
    width = max(len(row.ids) for row in rows) - 1
    table = np.full((len(rows), width + 1), PAD_TOKEN_ID, dtype=np.int64)
    scored = np.zeros((len(rows), width), dtype=bool)
    for index, row in enumerate(rows):
        table[index, :len(row.ids)] = row.ids
        scored[index, row.first:row.last] = True
    table = torch.from_numpy(table).to(device)
    positions = torch.arange(width, device=device).expand(len(rows), width)
    return table[:, :-1], positions, table[:, 1:], torch.from_numpy(scored).to(device)


def map_over_dp(model: EvalModel, count: int, run_batch: Callable[[list[int]], list[T]], desc: str) -> list[T]:
    """Run items ``0..count-1`` in batches, each data-parallel replica taking every dp-th item, and gather
    every result on every rank (collective over every process of the run).

    Args:
        run_batch: this replica's item indices (at most ``batch_size``) -> one result each, in order
            (collective over the replica's tp and pp ranks).
        desc: the progress bar's label.
    """
    sharded = model.sharded
    return map_over_replicas(count, model.batch_size, sharded.dp_rank, model.dp, sharded.dp_group, run_batch,
                             desc if model.progress else None)


def _score_batch(model: EvalModel, rows: list[ScoreRow], greedy: bool) -> list[RowScore]:
    tokens, positions, targets, scored = _batch(rows, model.sharded.device)
    log_probs, hits = model.sharded.score(tokens, positions, targets, scored, greedy)
    # The scored positions come row after row, each row's in order: split them back into rows.
    counts = [row.last - row.first for row in rows]
    log_probs, hits = log_probs.double().cpu().split(counts), hits.cpu().split(counts)
    return [RowScore(log_prob=float(row_log_probs.sum()), greedy=bool(row_hits.all()), count=count)
            for row_log_probs, row_hits, count in zip(log_probs, hits, counts, strict=True)]


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
