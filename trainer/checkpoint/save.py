"""Writing a checkpoint (collective): staged under ``iter_XXXXXXX.tmp``, its manifest written, renamed to its final
name when every rank has finished, then the pointer replaced atomically; a full disk, SIGTERM or Ctrl-C during a
save removes the staging and keeps what was there. The layout is `trainer.checkpoint.store`'s.
"""

from __future__ import annotations

import logging
import os
import shutil
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from indexed_dataset.cli_support import Interrupted
from trainer.checkpoint.disk_space import free_space_shortfall, is_disk_full, no_space_message
from trainer.checkpoint.manifest import mark_manifested, write_manifest
from trainer.checkpoint.store import (
    LATEST_FILE,
    TEMP_SUFFIX,
    barrier,
    checkpoint_dir,
    is_distributed,
    is_rank0,
    one_line,
)
from trainer.errors import CheckpointError

logger = logging.getLogger(__name__)


def save_checkpoint(root: str | os.PathLike, iteration: int, state: dict[str, torch.Tensor]) -> Path:
    """Write ``state`` as checkpoint ``iteration`` under ``root`` (collective: every rank calls it).

    Any failure (a full disk, SIGTERM or Ctrl-C) removes the staging ``iter_XXXXXXX.tmp`` and leaves the
    checkpoints already there, and the pointer, as they were.

    Returns:
        The checkpoint directory.

    Raises:
        CheckpointError: the disk has no room for it (checked first against the tensors' bytes, and again
            if the disk fills during the write), or the directory cannot be written; on every rank.
    """
    temp, needed = begin_save(root, iteration, state)
    try:
        barrier()
        with warnings.catch_warnings():
            # Single-process DCP warns that it assumes a single process, which is what we mean.
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            dcp.save(state, checkpoint_id=temp, no_dist=not is_distributed())
        complete_save(root, iteration, temp)
    except BaseException as error:
        if is_rank0():
            shutil.rmtree(temp, ignore_errors=True)
        raise save_failure(error, root, needed) from None
    barrier()
    return checkpoint_dir(root, iteration)


def begin_save(root: str | os.PathLike, iteration: int, state: dict[str, torch.Tensor]) -> tuple[Path, int]:
    """The first part of a save (collective): remove stale staging, refuse a disk without room for ``state``.

    Returns:
        The staging directory of checkpoint ``iteration`` and the bytes the checkpoint needs.

    Raises:
        CheckpointError: the disk has no room for it (on every rank).
    """
    final = checkpoint_dir(root, iteration)
    if is_rank0():
        Path(root).mkdir(parents=True, exist_ok=True)
        # Staging left by a process that was killed outright (SIGKILL, a launcher's stop of its workers). A run
        # holds the directory's lock (`trainer.checkpoint.save_directory`): no other run is writing staging there.
        for stale in Path(root).glob(f"iter_*{TEMP_SUFFIX}"):
            shutil.rmtree(stale, ignore_errors=True)
    needed = _checkpoint_bytes(state)
    refuse_on_every_rank(free_space_shortfall(root, needed) if is_rank0() else None)
    return final.with_name(final.name + TEMP_SUFFIX), needed


def complete_save(root: str | os.PathLike, iteration: int, temp: Path,
                  group: dist.ProcessGroup | None = None) -> None:
    """The last part of a save, once every rank's DCP files are in ``temp`` (collective over ``group``, default
    the whole world): the manifest, then the rename to the final name, then the pointer: a checkpoint is
    named, and pointed to, only when it is complete."""
    final = checkpoint_dir(root, iteration)
    if is_rank0():
        mark_manifested(temp)
    barrier(group)
    write_manifest(temp, is_writer=is_rank0(), group=group)
    if is_rank0():
        shutil.rmtree(final, ignore_errors=True)
        os.replace(temp, final)
        pointer = Path(root) / LATEST_FILE
        pointer_temp = pointer.with_name(pointer.name + TEMP_SUFFIX)
        try:
            pointer_temp.write_text(f"{iteration}\n")
            os.replace(pointer_temp, pointer)
        finally:
            pointer_temp.unlink(missing_ok=True)
        logger.info("saved checkpoint %s", final)


def _checkpoint_bytes(state: dict[str, torch.Tensor]) -> int:
    """Bytes of the tensors of a checkpoint, over every rank (their global sizes: a DTensor's numel is its
    global one; collective when distributed). DCP's own files add a few kilobytes."""
    sizes = {name: tensor.numel() * tensor.element_size() for name, tensor in state.items()}
    if is_distributed():
        gathered: list[dict[str, int] | None] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, sizes)
        sizes = {name: size for part in gathered for name, size in part.items()}
    return sum(sizes.values())


def refuse_on_every_rank(message: str | None) -> None:
    """Raise CheckpointError(``message``) on every rank when rank 0's ``message`` is not None (collective when
    distributed: what only rank 0 can decide, every rank must raise, or the others would wait for it)."""
    if is_distributed():
        shared = [message]
        dist.broadcast_object_list(shared, src=0)
        message = shared[0]
    if message is not None:
        raise CheckpointError(message)


def save_failure(error: BaseException, root: str | os.PathLike, needed: int) -> BaseException:
    """What a failed save raises: the interruption itself (SIGTERM, Ctrl-C), one line for a full disk or
    an unwritable directory, any other error as it is (a bug keeps its traceback)."""
    if isinstance(error, CheckpointException):
        # DCP catches everything its ranks raise, interruptions included, and gathers them.
        causes = [failure[0] if isinstance(failure, tuple) else failure for failure in error.failures.values()]
        error = next((c for c in causes if isinstance(c, (Interrupted, KeyboardInterrupt))),
                     next((c for c in causes if isinstance(c, OSError)), error))
    if is_disk_full(error):
        return CheckpointError(no_space_message(root, needed) + "; the checkpoints already there are kept")
    if isinstance(error, OSError):
        return CheckpointError(f"cannot write a checkpoint into {root}: {one_line(error)}")
    return error
