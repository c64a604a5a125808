"""The records of `metrics.jsonl`, read back: one run's training and evaluation series.

    from trainer.metrics.records import read_run
    run = read_run("runs/gpt-tiny")            # the folder holding metrics.jsonl, or the file itself
    run.train[0]["loss"], run.evaluations[0]["split"]

`trainer.metrics.writers.MetricsWriter` writes one JSON object per line: a *training* record every
`--log-interval` (iteration, consumed_samples, consumed_tokens, global_batch_size, lr, loss, grad_norm,
loss_scale, skipped_iterations, ms_per_iteration, data_ms_per_iteration, tokens_per_second,
tflops_per_device, mfu; with ``--timing-log-level 1`` also forward_backward_ms_per_iteration,
grad_clip_ms_per_iteration, optimizer_ms_per_iteration), an *evaluation* record after each evaluation
(iteration, split, loss, perplexity) and, with ``--print-memory``, one *memory* record after the first step (iteration, memory: a
list of per-rank byte counts). Keys a later trainer adds (MoE aux loss, expert load) are kept as they are.

This module imports neither torch nor matplotlib: `plot-metrics` reads files with it, and
`trainer.metrics.writers` shares `consumed_tokens` with it.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from indexed_dataset.errors import TokenmillError
from indexed_dataset.structured_files import parse_json

METRICS_FILE_NAME = "metrics.jsonl"
# The key that marks an evaluation record (its value: valid or test).
SPLIT_KEY = "split"
# The key that marks a `train --print-memory` record (its value: one dict of bytes per rank).
MEMORY_KEY = "memory"
# Milliseconds per second, to turn ms_per_iteration back into seconds.
MS_PER_SECOND = 1000.0


class MetricsFileError(TokenmillError):
    """A metrics file is missing or holds a line that is not a metrics record; names the file and line."""


@dataclass(slots=True)
class MetricsRun:
    """One run's records, in file order."""

    name: str
    """What the run is called in a legend (its folder's name by default)."""
    path: Path
    """The metrics.jsonl file read."""
    train: list[dict] = field(default_factory=list)
    """Training records (no ``split`` key)."""
    evaluations: list[dict] = field(default_factory=list)
    """Evaluation records (``split``: valid or test)."""
    memory: list[dict] = field(default_factory=list)
    """``--print-memory`` records (``memory``: per-rank bytes after the first step)."""


def tokens_per_sample(record: dict) -> int | None:
    """Tokens in one sample of the run that wrote a training ``record`` (T5: encoder + decoder positions).

    The trainer computes ``tokens_per_second = global_batch_size x tokens_per_sample / seconds`` and
    ``ms_per_iteration = 1000 x seconds`` from the same seconds, so the product gives the sample size
    back exactly up to float rounding. None when a field is missing (a record of another tool).
    """
    try:
        value = (record["tokens_per_second"] * record["ms_per_iteration"] / MS_PER_SECOND
                 / record["global_batch_size"])
    except (KeyError, TypeError, ZeroDivisionError):
        return None
    return round(value) if math.isfinite(value) else None


def consumed_tokens(record: dict) -> int | None:
    """Tokens trained on up to a training ``record``'s iteration: its own ``consumed_tokens`` when it
    has one, else consumed samples x `tokens_per_sample` (files written before the key existed)."""
    if isinstance(record.get("consumed_tokens"), int):
        return record["consumed_tokens"]
    per_sample = tokens_per_sample(record)
    samples = record.get("consumed_samples")
    return samples * per_sample if per_sample is not None and isinstance(samples, int) else None


def metrics_path(path: str | os.PathLike) -> Path:
    """The metrics file of ``path``: the path itself, or ``path/metrics.jsonl`` for a run folder.

    Raises:
        MetricsFileError: neither exists.
    """
    path = Path(path)
    candidate = path / METRICS_FILE_NAME if path.is_dir() else path
    if not candidate.is_file():
        where = f"{path} holds no {METRICS_FILE_NAME}" if path.is_dir() else f"{path}: no such metrics file"
        raise MetricsFileError(where)
    return candidate


def _parse_record(path: Path, number: int, line: str) -> dict:
    """One line as a record; every failure names ``path:number``."""
    record = parse_json(line, f"{path}:{number}", error=MetricsFileError)
    if not isinstance(record, dict):
        raise MetricsFileError(f"{path}:{number}: expected a JSON object, got {type(record).__name__}")
    if not isinstance(record.get("iteration"), int) or isinstance(record.get("iteration"), bool):
        raise MetricsFileError(f"{path}:{number}: no integer 'iteration' (not a tokenmill metrics record)")
    return record


def read_run(path: str | os.PathLike, name: str | None = None) -> MetricsRun:
    """Read a run's metrics file (or the one in a run folder).

    Args:
        path: a metrics.jsonl file, or a folder holding one (a `train --save` folder).
        name: the run's name in legends; default the folder's name (the file's stem when the file is
            not called metrics.jsonl).

    Raises:
        MetricsFileError: no file, a line that is not a JSON object with an integer iteration, or a
            file without any record.
    """
    file = metrics_path(path)
    if name is None:
        name = file.parent.resolve().name if file.name == METRICS_FILE_NAME else file.stem
    run = MetricsRun(name=name, path=file)
    with file.open("rb") as stream:
        for number, raw in enumerate(stream, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as error:
                raise MetricsFileError(f"{file}:{number}: not UTF-8 ({error.reason})") from None
            if not line.strip():
                continue
            record = _parse_record(file, number, line)
            kind = run.evaluations if SPLIT_KEY in record else run.memory if MEMORY_KEY in record else run.train
            kind.append(record)
    if not run.train and not run.evaluations:
        raise MetricsFileError(f"{file}: no metrics records (empty file)")
    return run
