"""Training and evaluation metrics: the Megatron-style log line, a JSON-lines file, TensorBoard, MFU.

Each family counts its own FLOPs per token (`ModelSpec.training_parts`), with `FORWARD_BACKWARD_FACTOR`.

Only rank 0 writes. TFLOP/s count model FLOPs (forward + backward = 3 x forward matmul FLOPs; the
recomputation of activation checkpointing is not counted), per device; MFU divides them by the
device's dense peak when it is known (bf16/fp16 on the GPUs in `PEAK_FLOPS`).
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch

from indexed_dataset.structured_files import StructuredFileError, parse_json
from trainer.metrics.records import MEMORY_KEY, consumed_tokens

logger = logging.getLogger(__name__)

# Dense bf16/fp16 tensor-core peaks in FLOP/s (vendor datasheets, SXM parts).
PEAK_FLOPS = {"H200": 989.4e12, "H100": 989.4e12, "A100": 312e12, "A800": 312e12, "H800": 989.4e12}
# forward + backward: the backward pass costs two forward passes.
FORWARD_BACKWARD_FACTOR = 3
# Megatron caps the loss at 20 before exponentiating: larger perplexities carry no information.
PERPLEXITY_LOSS_CAP = 20.0
# The phases `--timing-log-level 1` times (Megatron's level-1 timers, DeepSpeed's wall_clock_breakdown), in step
# order, with their log-line labels; the data wait is `TrainStats.data_ms_per_iteration`, measured always.
TIMING_PHASES = {"forward_backward": "forward-backward", "grad_clip": "grad norm+clip", "optimizer": "optimizer"}
# What `--timing-log-level 2` adds, Megatron's level-2 timers' names: the compute of the forward and of the backward
# passes, summed over the step's micro-batches, inside forward-backward. A pipelined run leaves them out: its
# schedule interleaves forwards, backwards and stage sends, which Megatron times apart and torch's schedule does not
# expose (so they would be the forward-backward time relabelled).
DETAILED_PHASES = {"forward_compute": "forward-compute", "backward_compute": "backward-compute"}
# Suffix of a phase's metrics key: ``forward_backward_ms_per_iteration``, as ``data_ms_per_iteration``.
PHASE_KEY_SUFFIX = "_ms_per_iteration"


def device_peak_flops(device: torch.device, low_precision: bool) -> float | None:
    """The device's dense bf16/fp16 peak, or None when unknown (CPUs, fp32, unlisted GPUs)."""
    if device.type != "cuda" or not low_precision:
        return None
    name = torch.cuda.get_device_name(device)
    return next((peak for key, peak in PEAK_FLOPS.items() if key in name), None)


def synchronize(device: torch.device) -> None:
    """Wait for the work queued on ``device`` (a CUDA device; nothing to wait for on a CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class StepTimer:
    """Wall-clock seconds per phase (`TIMING_PHASES`), summed over the steps since the last `take`.

    Disabled (``--timing-log-level 0``) it times nothing and never synchronises. Enabled, it synchronises
    ``device`` at each phase's start and end, so a phase's time holds its queued kernels (what Megatron's and
    DeepSpeed's timers do; it serialises work that would otherwise overlap, at a small cost in step time).
    """

    def __init__(self, enabled: bool, device: torch.device, detailed: bool = False) -> None:
        self.enabled, self.device = enabled, device
        # ``detailed`` (level 2) also times `DETAILED_PHASES`.
        self.phases = {**TIMING_PHASES, **DETAILED_PHASES} if enabled and detailed else TIMING_PHASES
        self.seconds = dict.fromkeys(self.phases, 0.0)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time the block as phase ``name`` (one of `TIMING_PHASES`, or `DETAILED_PHASES`: timed when detailed)."""
        if not self.enabled or name not in self.seconds:
            yield
            return
        synchronize(self.device)
        start = time.perf_counter()
        try:
            yield
        finally:
            synchronize(self.device)
            self.seconds[name] += time.perf_counter() - start

    def take(self, steps: int) -> dict[str, float]:
        """Each phase's milliseconds per step over the last ``steps`` steps (``{}`` when disabled), keyed
        ``<phase>_ms_per_iteration``; the sums restart from 0."""
        if not self.enabled:
            return {}
        timing = {name + PHASE_KEY_SUFFIX: 1000 * seconds / steps for name, seconds in self.seconds.items()}
        self.seconds = dict.fromkeys(self.phases, 0.0)
        return timing


@dataclass(slots=True)
class TrainStats:
    """Averages over one log interval."""

    iteration: int
    train_iters: int
    consumed_samples: int
    global_batch_size: int
    lr: float
    loss: float
    grad_norm: float
    loss_scale: float
    skipped_iterations: int
    ms_per_iteration: float
    data_ms_per_iteration: float
    tokens_per_second: float
    tflops_per_device: float
    mfu: float | None
    auxiliary: dict[str, float] = field(default_factory=dict)
    """The model's auxiliary losses and metrics (`trainer.optim.auxiliary_losses`), by name; logged after the rest."""
    timing: dict[str, float] = field(default_factory=dict)
    """``--timing-log-level 1``: each phase's ms per step (`StepTimer.take`); empty at level 0."""

    def log_line(self) -> str:
        line = (f" iteration {self.iteration:8d}/{self.train_iters:8d} | consumed samples: {self.consumed_samples:12d}"
                f" | elapsed time per iteration (ms): {self.ms_per_iteration:.1f}"
                f" | learning rate: {self.lr:.6E} | global batch size: {self.global_batch_size:5d}"
                f" | lm loss: {self.loss:.6E} | loss scale: {self.loss_scale:.1f} | grad norm: {self.grad_norm:.3f}"
                f" | number of skipped iterations: {self.skipped_iterations:3d}"
                f" | tokens/s: {self.tokens_per_second:.0f} | TFLOP/s/device: {self.tflops_per_device:.3f}")
        if self.mfu is not None:
            line += f" | MFU: {100 * self.mfu:.1f}%"
        if self.timing:
            line += f" | data (ms): {self.data_ms_per_iteration:.1f}"
            for phase, label in {**TIMING_PHASES, **DETAILED_PHASES}.items():
                if phase + PHASE_KEY_SUFFIX in self.timing:
                    line += f" | {label} (ms): {self.timing[phase + PHASE_KEY_SUFFIX]:.1f}"
        for name, value in self.auxiliary.items():
            line += f" | {name}: {value:.6E}"
        return line


def _drop_records_after(path: Path, iteration: int) -> None:
    """Rewrite the JSON-lines file ``path`` (if it exists) without its records of later iterations."""
    if not path.is_file() or path.stat().st_size == 0:
        return
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    kept = [line for line in lines if _record_iteration(line) <= iteration]
    if len(kept) == len(lines):
        return
    temp = path.with_name(path.name + ".tmp")
    temp.write_text("".join(kept), encoding="utf-8")
    os.replace(temp, path)
    logger.info("%s: dropped %d records after iteration %d (redone by this run)", path, len(lines) - len(kept),
                iteration)


def _record_iteration(line: str) -> int:
    """The ``iteration`` of one JSON-lines record; a line that is not one is kept (-1)."""
    try:
        record = parse_json(line, "a metrics record")
    except StructuredFileError:
        return -1
    value = record.get("iteration") if isinstance(record, dict) else None
    return value if isinstance(value, int) else -1


@dataclass(frozen=True, slots=True)
class WandbRun:
    """The Weights & Biases run a `MetricsWriter` logs to (Megatron's --wandb-* flags)."""

    project: str
    name: str | None = None
    save_dir: str | None = None
    """Directory of wandb's local files (None: wandb's default, ./wandb)."""
    config: dict = field(default_factory=dict)
    """The run's settings, shown with it."""


class MetricsWriter:
    """Writes log lines, JSON lines, TensorBoard scalars and Weights & Biases metrics on rank 0; does nothing
    elsewhere.

    The JSON-lines file (none when ``metrics_file`` is None) continues the run's history: records of
    iterations after ``start_iteration`` (the resumed checkpoint's; 0 from scratch), which the run is
    about to redo, are dropped, so a resumed run never repeats a line.
    """

    def __init__(self, metrics_file: str | os.PathLike | None, tensorboard_dir: str | None, is_rank0: bool,
                 start_iteration: int = 0, wandb_run: WandbRun | None = None) -> None:
        self.enabled = is_rank0
        self._file = None
        self._tensorboard = None
        self._wandb = None
        if not self.enabled:
            return
        if wandb_run is not None:
            import wandb  # imported only when asked: optional package (pip install wandb)

            self._wandb = wandb.init(project=wandb_run.project, name=wandb_run.name, dir=wandb_run.save_dir,
                                     config=wandb_run.config)
        if metrics_file is not None:
            path = Path(metrics_file)
            path.parent.mkdir(parents=True, exist_ok=True)
            _drop_records_after(path, start_iteration)
            self._file = path.open("a", encoding="utf-8")
        if tensorboard_dir is not None:
            from torch.utils.tensorboard import SummaryWriter  # imported only when asked: optional package

            self._tensorboard = SummaryWriter(tensorboard_dir)

    def _write(self, record: dict) -> None:
        if self._file is not None:
            self._file.write(json.dumps(record) + "\n")
            self._file.flush()

    def train(self, stats: TrainStats) -> None:
        if not self.enabled:
            return
        logger.info(stats.log_line())
        record = {name: getattr(stats, name) for name in stats.__slots__
                  if name not in ("train_iters", "auxiliary", "timing")}
        record |= stats.timing | stats.auxiliary
        record["consumed_tokens"] = consumed_tokens(record)
        self._write(record)
        self._add_scalars("train", record)

    def evaluation(self, iteration: int, split: str, loss: float) -> None:
        if not self.enabled:
            return
        perplexity = math.exp(min(loss, PERPLEXITY_LOSS_CAP))
        logger.info(" %s loss at iteration %d | lm loss value: %.6E | lm loss PPL: %.6E", split, iteration, loss,
                    perplexity)
        record = {"iteration": iteration, "split": split, "loss": loss, "perplexity": perplexity}
        self._write(record)
        self._add_scalars(split, record)

    def memory(self, iteration: int, ranks: list[dict]) -> None:
        """The ``--print-memory`` record: ``{"iteration": i, "memory": [one dict per rank]}`` (the fields of
        `trainer.metrics.memory_report.MemoryReport`)."""
        if not self.enabled:
            return
        self._write({"iteration": iteration, MEMORY_KEY: ranks})

    def _add_scalars(self, section: str, record: dict) -> None:
        """Every number of a JSON-lines ``record`` as TensorBoard scalar and W&B metric ``section/key`` at its
        iteration (the same series as the file; None, an MFU the device's peak does not give, is left out)."""
        scalars = {f"{section}/{name}": value for name, value in record.items()
                   if name != "iteration" and isinstance(value, (int, float)) and not isinstance(value, bool)}
        if self._tensorboard is not None:
            for name, value in scalars.items():
                self._tensorboard.add_scalar(name, value, record["iteration"])
        if self._wandb is not None:
            self._wandb.log(scalars, step=record["iteration"])

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
        if self._tensorboard is not None:
            self._tensorboard.close()
        if self._wandb is not None:
            self._wandb.finish()
