"""Leaving a run before ``train_iters`` with a checkpoint: Megatron's ``--exit-interval``,
``--exit-duration-in-mins`` and ``--exit-signal-handler``.

    with EarlyExit(exit_interval=None, exit_duration_s=3600.0, exit_signal=signal.SIGTERM,
                   started=time.monotonic()) as early_exit:
        for each step:
            ...
            reason = early_exit.reason(iteration)   # collective (when a rank-local condition is asked for)
            if reason is not None:
                save, say why, stop

The signal only sets a flag (the step in flight finishes); after each step the ranks all-reduce their flags
and elapsed-time verdicts with MAX, so that a signal that reached one rank only, or a clock that crossed the
limit on one rank first, stops every rank at the same step (Megatron's all-reduce of ``done_cuda``). They do so
over a gloo group of their own, on host tensors: under NCCL a device all-reduce and its read would wait for the
work queued before it (the trainer checks a step while the next step's backward runs on the GPU).
"""

from __future__ import annotations

import signal
import threading
import time
from types import FrameType, TracebackType

import torch
import torch.distributed as dist

from trainer.errors import TrainConfigError

SECONDS_PER_MINUTE = 60.0
# The slots of the agreed flags: a signal arrived, the time is up.
_SIGNALLED, _TIME_UP = 0, 1


class EarlyExit:
    """The run's exit conditions; a context manager that holds the signal handler while the run lasts.

    Args:
        exit_interval: stop after an iteration divisible by it (None: never).
        exit_duration_s: stop after the first step that ends this many seconds after ``started`` (None: never).
        exit_signal: the signal that asks the run to stop (None: no handler; the signal does what it did).
        started: `time.monotonic` value the duration counts from.

    Collective when the run is distributed and a signal or a duration is asked for: every rank builds it (it
    creates the agreement's group).
    """

    def __init__(self, exit_interval: int | None, exit_duration_s: float | None, exit_signal: signal.Signals | None,
                 started: float) -> None:
        self.exit_interval, self.exit_duration_s, self.exit_signal = exit_interval, exit_duration_s, exit_signal
        self.started = started
        agreed = (exit_signal is not None or exit_duration_s is not None) and dist.is_initialized() \
            and dist.get_world_size() > 1
        self._group = dist.new_group(backend="gloo") if agreed else None
        """The ranks' agreement on the flags (None: one process, or nothing rank-local to agree on)."""
        self.signalled = False
        self._previous_handler: signal.Handlers | None = None

    def __enter__(self) -> EarlyExit:
        if self.exit_signal is not None:
            if threading.current_thread() is not threading.main_thread():
                raise TrainConfigError("exit_signal_handler needs the run in the main thread (signal handlers can "
                                       "only be set there)")
            self._previous_handler = signal.signal(self.exit_signal, self._on_signal)
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        if self.exit_signal is not None:
            signal.signal(self.exit_signal, self._previous_handler)

    def _on_signal(self, signal_number: int, frame: FrameType | None) -> None:
        # Only a flag: the step in flight (and any collective in it) must finish on every rank.
        self.signalled = True

    def reason(self, iteration: int) -> str | None:
        """Why the run stops after ``iteration``, or None to go on; the same on every rank (collective when a
        signal handler or a duration is set and the run is distributed)."""
        flags = [self.signalled, self.exit_duration_s is not None
                 and time.monotonic() - self.started >= self.exit_duration_s]
        if self._group is not None:
            agreed = torch.tensor(flags, dtype=torch.int32)
            dist.all_reduce(agreed, op=dist.ReduceOp.MAX, group=self._group)
            flags = [bool(flag) for flag in agreed.tolist()]
        if flags[_SIGNALLED]:
            return f"{self.exit_signal.name} received (exit_signal_handler)"
        if flags[_TIME_UP]:
            minutes = (time.monotonic() - self.started) / SECONDS_PER_MINUTE
            return f"{minutes:.2f} minutes elapsed (exit_duration_in_mins {self.exit_duration_s / SECONDS_PER_MINUTE:g})"
        if self.exit_interval is not None and iteration % self.exit_interval == 0:
            return f"iteration {iteration} is a multiple of exit_interval {self.exit_interval}"
        return None
