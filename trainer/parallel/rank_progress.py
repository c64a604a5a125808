"""Each rank's progress in the process group's store, so that a rank whose collective timed out can name the
ranks that did not arrive (gloo's timeout names no peer).

Two records per rank, in the store the ranks met in (`trainer.parallel.distributed.DistContext.store`, under the
attempt's prefix):

- ``tokenmill/progress/<rank>``: ``"<iteration> <phase>"``, written by the step loop as it enters a phase: once per
  step, once more per evaluation or save (a store ``set`` waits for no reply: 4-13 us, median 9 us, on a loaded
  2-core machine).
- ``tokenmill/beat/<rank>``: a counter a background thread raises every `BEAT_INTERVAL_S`. A rank that waits in a
  collective releases the GIL and its counter goes on; one that is stopped (SIGSTOP, swapped out, hung in the
  kernel) or dead stands still.

    with RankProgress.open(ctx.store, ctx.rank, ctx.world_size) as progress:
        progress.enter(iteration, "step")
        ...
        # after a collective's timeout, on the rank that waited:
        for rank in progress.absent_ranks(): ...
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta

import torch.distributed as dist

logger = logging.getLogger(__name__)

PROGRESS_KEY = "tokenmill/progress/"
BEAT_KEY = "tokenmill/beat/"
# Seconds between two raises of a rank's beat counter (one store round trip each, off the step loop).
BEAT_INTERVAL_S = 1.0
# How long the rank that timed out watches the other ranks' counters: a live rank raises its counter at least
# twice in it, even on a machine busy enough to delay a thread by a second.
LIVENESS_WINDOW_S = 3 * BEAT_INTERVAL_S
# Seconds a store operation of these records may take before it gives up (never the collective's timeout).
STORE_TIMEOUT_S = 5.0
# The phases of one iteration, in the order the step loop enters them: "setup" before the first step (loading,
# building the mesh), "step" (forward, backward, the gradients' and the loss's reductions, the exit agreement),
# then the evaluation and the save that may follow the step, and after the last step the final evaluations.
PHASES = ("setup", "step", "evaluation", "save", "final evaluations")


@dataclass(frozen=True, slots=True)
class Position:
    """Where a rank's step loop is: the iteration it is at and the phase of it it entered last."""

    iteration: int
    """The step being taken (phase "step"), or the last completed one (the other phases)."""
    phase: str

    @property
    def completed_iteration(self) -> int:
        return self.iteration - 1 if self.phase == "step" else self.iteration

    def order(self) -> tuple[int, int]:
        return self.iteration, PHASES.index(self.phase)

    def encode(self) -> str:
        return f"{self.iteration} {self.phase}"

    @classmethod
    def decode(cls, text: str) -> Position:
        iteration, phase = text.split(" ", 1)  # a phase may hold a space ("final evaluations")
        return cls(int(iteration), phase)

    def describe(self) -> str:
        if self.phase == "setup":
            return "it has not started its first step"
        where = {"step": "in the step of", "evaluation": "in the evaluation after", "save": "in the save after",
                 "final evaluations": "in the final evaluations after"}
        return (f"it is {where[self.phase]} iteration {self.iteration} and its last completed iteration is "
                f"{self.completed_iteration}")


@dataclass(frozen=True, slots=True)
class AbsentRank:
    """A rank that did not arrive at the collective another rank timed out in."""

    rank: int
    position: Position | None
    """Its last record (None: it wrote none, it never reached the trainer's setup)."""
    running: bool
    """Whether its beat counter moved (False: stopped, hung or dead)."""

    def describe(self) -> str:
        state = "" if self.running else f"it has not run for {LIVENESS_WINDOW_S:g} s (stopped, hung or dead), "
        where = self.position.describe() if self.position else "it never reached the trainer's setup"
        return f"rank {self.rank} did not arrive: {state}{where}"


class RankProgress:
    """This rank's records, and the reading of every rank's after a timeout (`absent_ranks`)."""

    def __init__(self, store: dist.Store, rank: int, world_size: int) -> None:
        # One client per thread (torch's `Store.clone`), each with a short timeout of its own.
        self._store, self._beat_store = store.clone(), store.clone()
        for client in (self._store, self._beat_store):
            client.set_timeout(timedelta(seconds=STORE_TIMEOUT_S))
        self.rank, self.world_size = rank, world_size
        self.position = Position(0, "setup")
        self._stopped = threading.Event()
        self._beats = threading.Thread(target=self._beat, name="rank-progress-beat", daemon=True)

    @classmethod
    @contextmanager
    def open(cls, store: dist.Store | None, rank: int, world_size: int) -> Iterator[RankProgress | None]:
        """The records of a distributed run (None for a single process, or a group the caller initialised:
        no store to write to); the beat thread runs until the block ends."""
        if store is None or world_size == 1:
            yield None
            return
        progress = cls(store, rank, world_size)
        progress.enter(0, "setup")
        progress._beats.start()
        try:
            yield progress
        finally:
            progress._stopped.set()
            progress._beats.join()

    def enter(self, iteration: int, phase: str) -> None:
        """Record that this rank enters ``phase`` of ``iteration`` (see `Position.iteration`)."""
        self.position = Position(iteration, phase)
        try:
            self._store.set(f"{PROGRESS_KEY}{self.rank}", self.position.encode())
        except dist.DistError as error:  # the store went away: the run's own collectives will say so
            logger.debug("rank %d: progress record not written (%s)", self.rank, error)

    def _beat(self) -> None:
        key = f"{BEAT_KEY}{self.rank}"
        while not self._stopped.is_set():
            try:
                self._beat_store.add(key, 1)
            except dist.DistError:  # the store went away (the launcher stops the run): nobody left to tell
                return
            self._stopped.wait(BEAT_INTERVAL_S)

    def absent_ranks(self) -> list[AbsentRank] | None:
        """The ranks that did not arrive where this one waits: those whose beat counter stands still over
        `LIVENESS_WINDOW_S`, and those whose record is behind this rank's. None when the store does not answer
        within `STORE_TIMEOUT_S`."""
        others = [rank for rank in range(self.world_size) if rank != self.rank]
        try:
            beats = self._read_beats(others)
            positions = {rank: self._read_position(rank) for rank in others}
            time.sleep(LIVENESS_WINDOW_S)
            beats_after = self._read_beats(others)
        except dist.DistError as error:
            logger.debug("rank %d: the other ranks' progress is not readable (%s)", self.rank, error)
            return None
        absent = []
        for rank in others:
            running = beats_after[rank] > beats[rank]
            position = positions[rank]
            if not running or position is None or position.order() < self.position.order():
                absent.append(AbsentRank(rank, position, running))
        return absent

    def _read_beats(self, ranks: list[int]) -> dict[int, int]:
        # `add(key, 0)` reads a counter without waiting for it to exist (a missing one reads 0).
        return {rank: self._store.add(f"{BEAT_KEY}{rank}", 0) for rank in ranks}

    def _read_position(self, rank: int) -> Position | None:
        key = f"{PROGRESS_KEY}{rank}"
        if not self._store.check([key]):  # `get` would wait for it
            return None
        return Position.decode(self._store.get(key).decode())
