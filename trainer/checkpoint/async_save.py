"""Checkpoints written in the background (``train --async-save``, Megatron's flag) while the steps go on.

    saver = AsyncSaver(group)               # group: a gloo group of every rank (None in one process)
    saver.start(root, iteration, state)     # collective; returns once the state is copied to CPU memory
    ...                                     # more steps
    saver.wait()                            # collective; before the next save and at the end of the run

`start` does the checks of a save (room on the disk), then copies the tensors into CPU buffers (the stall of
the step loop), and a thread does the rest of `trainer.checkpoint.save.save_checkpoint` with the copies: DCP's
save, the manifest, the rename, the pointer. The files are the same as a synchronous save's, and a crash
before the end leaves only the staging directory, which no load takes and the next save removes: the
previous checkpoint stays the latest. The buffers are kept from one save to the next (a save waits for the
previous one, so they are free again): fresh memory would cost its page faults at every save, several times
the copy itself (DCP's own ``async_save`` allocates its copies anew each time).

The background collectives (DCP's plan exchange, the manifest's, the barriers) go over ``group``, never the
default group, whose collectives the step loop issues meanwhile from the main thread.
"""

from __future__ import annotations

import os
import shutil
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.tensor import DTensor

from trainer.checkpoint.save import begin_save, complete_save, save_failure
from trainer.checkpoint.store import checkpoint_dir

# Single-process DCP warns, from the saving thread, that it assumes a single process, which is what we mean
# (`trainer.checkpoint.store` silences the same warning of a synchronous save, in the thread that saves:
# `warnings.catch_warnings` is not thread-safe).
warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)


@dataclass(slots=True)
class _Pending:
    """One save in flight: its thread, and what it raised."""

    root: str | os.PathLike
    iteration: int
    needed: int
    thread: threading.Thread
    error: BaseException | None = None


class AsyncSaver:
    """At most one checkpoint in flight at a time.

    Args:
        group: a gloo process group of every rank for the background collectives (None when not distributed).
    """

    def __init__(self, group: dist.ProcessGroup | None) -> None:
        self.group = group
        self._pending: _Pending | None = None
        self._buffers: dict[str, torch.Tensor] = {}
        """Name -> the CPU tensor (a DTensor's local shard) each save copies that tensor into."""

    @torch.no_grad()
    def _staged(self, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """``state`` copied into this saver's CPU buffers (DTensors stay DTensors, over their CPU shards)."""
        staged = {}
        # A copy is bound by memory bandwidth, which one thread reaches; more threads only contend (on a
        # loaded 2-core machine the default pool made the copy five times slower).
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            for name, tensor in state.items():
                staged[name] = self._copy(name, tensor)
        finally:
            torch.set_num_threads(threads)
        return staged

    def _copy(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` copied into the buffer kept for ``name``."""
        local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
        buffer = self._buffers.get(name)
        if buffer is None or buffer.shape != local.shape or buffer.dtype != local.dtype:
            buffer = self._buffers[name] = torch.empty(local.shape, dtype=local.dtype, device="cpu")
        buffer.copy_(local)
        if isinstance(tensor, DTensor):
            return DTensor.from_local(buffer, tensor.device_mesh, tensor.placements, run_check=False,
                                      shape=tensor.shape, stride=tensor.stride())
        return buffer

    def start(self, root: str | os.PathLike, iteration: int, state: dict[str, torch.Tensor]) -> None:
        """Wait for the previous save, then start writing ``state`` as checkpoint ``iteration`` (collective).

        Raises:
            CheckpointError: the previous save failed, or the disk has no room for this one.
        """
        self.wait()
        temp, needed = begin_save(root, iteration, state)
        is_writer = not dist.is_initialized() or dist.get_rank() == 0
        staged = self._staged(state)

        def finish() -> None:
            try:
                dcp.save(staged, checkpoint_id=temp, process_group=self.group, no_dist=self.group is None)
                complete_save(root, iteration, temp, self.group)
            except BaseException as error:  # noqa: BLE001 -- handed to the main thread by `wait`
                if is_writer:
                    shutil.rmtree(temp, ignore_errors=True)
                pending.error = error

        # A daemon: a run that is ending on an error does not wait for a save that can no longer complete.
        pending = _Pending(root, iteration, needed, threading.Thread(target=finish, name="async-save", daemon=True))
        pending.thread.start()
        self._pending = pending

    def wait(self) -> Path | None:
        """Wait until the save in flight is complete (named and pointed to); its directory, or None if none.

        Raises:
            CheckpointError: it failed (a full disk, an unwritable directory).
        """
        pending, self._pending = self._pending, None
        if pending is None:
            return None
        pending.thread.join()
        if pending.error is not None:
            raise save_failure(pending.error, pending.root, pending.needed) from None
        return checkpoint_dir(pending.root, pending.iteration)
