"""What Megatron's training loop does around each step for observation: ``--profile`` (a torch.profiler trace),
``--record-memory-history`` (CUDA allocator snapshots) and ``--manual-gc`` (Python's collector run by hand).

    observer = StepObserver(config.observability, trace_root, rank, device, log_interval)
    with observer:
        for iteration in ...:
            with observer.step(iteration):
                ...  # one optimiser step

The trace covers the steps ``profile_step_start <= iteration < profile_step_end`` (iterations count from 1, as
the log line's), each inside a ``ProfilerStep#<iteration>`` range (torch.profiler's own step marker), and is
written as ``<trace_root>/torch_profile/rank-<rank>.json.gz`` (Megatron's name), a Chrome trace that Perfetto
(ui.perfetto.dev) and TensorBoard's profiler open.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from trainer.errors import TrainConfigError

if TYPE_CHECKING:  # annotation only: trainer.config imports trainer.parallel, which imports trainer.metrics
    from trainer.config import ObservabilityConfig

logger = logging.getLogger(__name__)

PROFILE_DIR_NAME = "torch_profile"
# Allocation events kept by --record-memory-history (Megatron's trace_alloc_max_entries).
MEMORY_HISTORY_MAX_ENTRIES = 100_000


def trace_root(tensorboard_dir: str | None, save: str | None) -> str | None:
    """Where ``torch_profile/`` goes: beside ``tensorboard_dir`` (Megatron's ``<tensorboard_dir>/..``), else in
    ``save``; None when neither is given."""
    if tensorboard_dir is not None:
        return str(Path(tensorboard_dir).parent)
    return save


def trace_path(root: str | os.PathLike, rank: int) -> Path:
    """The trace file of ``rank`` under ``root``."""
    return Path(root) / PROFILE_DIR_NAME / f"rank-{rank}.json.gz"


class StepObserver:
    """Profiling, memory history and manual garbage collection around the steps of one run (one rank).

    Raises:
        TrainConfigError: record_memory_history on a device other than CUDA.
    """

    def __init__(self, settings: ObservabilityConfig, root: str | None, rank: int, device: torch.device,
                 log_interval: int) -> None:
        self.settings, self.rank, self.device, self.log_interval = settings, rank, device, log_interval
        # ``root`` is None only without profile (the config requires a place for the trace).
        selected = rank in settings.profile_ranks
        if settings.record_memory_history and device.type != "cuda":
            raise TrainConfigError(f"record_memory_history records the CUDA allocator's history; this run computes "
                                   f"on {device.type}")
        self.trace = trace_path(root, rank) if settings.profile and selected and root is not None else None
        self.snapshots = settings.record_memory_history and selected
        self._profiler: torch.profiler.profile | None = None
        self._gc_was_enabled = gc.isenabled()

    def __enter__(self) -> StepObserver:
        if self.settings.manual_gc:
            gc.disable()
            gc.collect()
        if self.snapshots:
            torch.cuda.memory._record_memory_history(max_entries=MEMORY_HISTORY_MAX_ENTRIES)
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._profiler is not None:  # the run ended inside the profiled steps
            self._finish_trace()
        if self.snapshots:
            torch.cuda.memory._record_memory_history(enabled=None)
        if self.settings.manual_gc and self._gc_was_enabled:
            gc.enable()

    @contextlib.contextmanager
    def step(self, iteration: int) -> Iterator[None]:
        """Observe the step that makes ``iteration`` (counted from 1)."""
        settings = self.settings
        # (a run resumed inside the window profiles the rest of it)
        if self.trace is not None and self._profiler is None and \
                settings.profile_step_start <= iteration < settings.profile_step_end:
            self._start_trace(iteration)
        if self._profiler is not None:
            with torch.profiler.record_function(f"ProfilerStep#{iteration}"):
                yield
        else:
            yield
        if self._profiler is not None and iteration >= settings.profile_step_end - 1:
            self._finish_trace()
        if settings.manual_gc and settings.manual_gc_interval and iteration % settings.manual_gc_interval == 0:
            gc.collect()
        if self.snapshots and iteration % self.log_interval == 0:
            self._dump_snapshot()

    def _start_trace(self, iteration: int) -> None:
        activities = [torch.profiler.ProfilerActivity.CPU]
        if self.device.type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self._profiler = torch.profiler.profile(activities=activities)
        self._profiler.start()
        logger.info("rank %d: profiling from iteration %d", self.rank, iteration)

    def _finish_trace(self) -> None:
        """Stop the profiler and write its trace under a temporary name, then rename it."""
        profiler, self._profiler = self._profiler, None
        profiler.stop()
        self.trace.parent.mkdir(parents=True, exist_ok=True)
        temporary = self.trace.with_name(f".{self.trace.name}.tmp.json.gz")
        profiler.export_chrome_trace(str(temporary))
        os.replace(temporary, self.trace)
        logger.info("rank %d: torch.profiler trace written to %s (open it in ui.perfetto.dev or TensorBoard)",
                    self.rank, self.trace)

    def _dump_snapshot(self) -> None:
        """The allocator snapshot as Megatron names it: PATH_<rank>.SUFFIX (written aside, then renamed)."""
        base, suffix = os.path.splitext(self.settings.memory_snapshot_path)
        target = Path(f"{base}_{self.rank}{suffix}")
        temporary = target.with_name(f".{target.name}.tmp")
        torch.cuda.memory._dump_snapshot(str(temporary))
        os.replace(temporary, target)
