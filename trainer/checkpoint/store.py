"""Where checkpoints live: the layout of a checkpoint root, which iteration is the latest complete one, and removing
old ones. Writing is `trainer.checkpoint.save`, reading `trainer.checkpoint.load`.

Layout (Megatron's names)::

    <dir>/iter_0000100/            one DCP checkpoint: .metadata + one shard file per rank
    <dir>/latest_checkpointed_iteration.txt   "100"

A checkpoint is written under ``iter_XXXXXXX.tmp`` and renamed when every rank has finished, and the
pointer file is replaced atomically after that, so a crash never leaves a valid-looking half
checkpoint. Without a pointer file the latest complete iteration directory is used; a broken pointer is an error.
Everything saved is a tensor keyed by its full-model name (``model.layers.0.attention.wq.weight``,
``optim.<param>.exp_avg``, ``train.iteration``), so a checkpoint loads into any tp/pp/dp layout.

Every checkpoint directory also holds ``manifest.json`` (`trainer.checkpoint.manifest`): the size and
SHA-256 of each of its files, written at save and checked at load.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
from pathlib import Path

import torch.distributed as dist

from trainer.checkpoint.manifest import MANIFESTED_FILE, has_listed_sizes, read_manifest
from trainer.errors import CheckpointError

logger = logging.getLogger(__name__)

LATEST_FILE = "latest_checkpointed_iteration.txt"
# Beside the iterations: what the tensors cannot tell about the model (`trainer.models.gpt.convert`, `trainer.models.t5.convert`).
MODEL_CONFIG_FILE = "model_config.json"
# Model tensors are saved as "model.<parameter name>", optimiser states as "optim.<parameter name>.<key>".
MODEL_PREFIX = "model."
OPTIMIZER_PREFIX = "optim."
# A checkpoint converted from Hugging Face: the model only, at iteration 0 (training starts afresh from it).
IMPORTED_ITERATION = 0
TEMP_SUFFIX = ".tmp"
# Characters of a malformed pointer file shown in its error.
_SHOWN_CHARS = 40
# One checkpoint's directory under a root: iter_0000100.
ITERATION_DIR = re.compile(r"^iter_(\d+)$")
# The files of a Megatron --ckpt-format torch iteration directory (one per model-parallel rank).
LEGACY_TORCH_FILES = "mp_rank_*/model_optim_rng.pt"
METADATA_FILE = ".metadata"
def checkpoint_dir(root: str | os.PathLike, iteration: int) -> Path:
    return Path(root) / f"iter_{iteration:07d}"


def is_distributed() -> bool:
    """Whether several processes take part (collectives are needed)."""
    return dist.is_initialized() and dist.get_world_size() > 1


def barrier(group: dist.ProcessGroup | None = None) -> None:
    """A barrier over ``group`` (default: every rank) when distributed, else nothing."""
    if is_distributed():
        dist.barrier(group=group)


def is_rank0() -> bool:
    """Whether this process writes what one process writes (rank 0, or the only process)."""
    return not dist.is_initialized() or dist.get_rank() == 0


def check_load_path(root: str | os.PathLike | None, save: str | os.PathLike | None = None) -> None:
    """A ``--load`` path must exist (a typo must not silently train from scratch); an empty directory
    is a fresh start, and so is ``--load P --save P`` with P not there yet (Megatron's and OneFlow's
    resume-or-start idiom: the same path twice is no typo).

    Raises:
        CheckpointError: ``root`` does not exist or is not a directory.
    """
    if root is None or Path(root).is_dir():
        return
    if save is not None and not Path(root).exists() and Path(root).resolve() == Path(save).resolve():
        return
    what = "is not a directory" if Path(root).exists() else "does not exist"
    raise CheckpointError(f"the checkpoint to load, {root}, {what}: give a checkpoint root, or an empty "
                          "directory to start from scratch")


def latest_iteration(root: str | os.PathLike) -> int | None:
    """The iteration the pointer file names, or None when ``root`` holds no checkpoint.

    Without a pointer file, the latest complete ``iter_XXXXXXX`` directory (`is_complete`) is the one, and a
    warning says so (a run that lost its pointer must not restart from scratch and save over itself).

    Raises:
        CheckpointError: the pointer is unreadable (a symlink loop, a dangling link, a directory), does
            not hold an iteration number, or names a missing checkpoint; there is no pointer and no
            complete iteration directory among several.
    """
    pointer = Path(root) / LATEST_FILE
    if not os.path.lexists(pointer):
        return _latest_complete_iteration(root)
    hint = f"remove it to resume from the latest complete iteration directory of {root}"
    try:
        text = pointer.read_text(encoding="ascii").strip()
    except OSError as error:
        raise CheckpointError(f"{pointer}: unreadable pointer file ({error.strerror}): {hint}") from None
    except UnicodeDecodeError:
        raise CheckpointError(f"{pointer}: not an iteration number (binary content): {hint}") from None
    if not text.isdigit():
        raise CheckpointError(f"{pointer}: expected an iteration number, found {text[:_SHOWN_CHARS]!r}: {hint}")
    iteration = int(text)
    legacy = next(checkpoint_dir(root, iteration).glob(LEGACY_TORCH_FILES), None)
    if legacy is not None:
        raise CheckpointError(f"{legacy} is a Megatron --ckpt-format torch checkpoint (per-rank files): train reads "
                              "torch_dist checkpoints only (Megatron's tools/checkpoint/convert.py converts it)")
    if not (checkpoint_dir(root, iteration) / METADATA_FILE).exists():
        raise CheckpointError(f"{pointer} names iteration {iteration} but {checkpoint_dir(root, iteration)} "
                              "is missing or incomplete")
    return iteration


def is_complete(directory: Path) -> bool:
    """True for an iteration directory that holds its ``.metadata`` and, when it has a manifest (or was written
    with one), every file the manifest lists at its listed size (the bytes are checked when it is loaded)."""
    if not (directory / METADATA_FILE).is_file():
        return False
    try:
        manifest = read_manifest(directory)
    except CheckpointError:
        return False
    if manifest is None:
        return not (directory / MANIFESTED_FILE).exists()
    return has_listed_sizes(directory, manifest[0])


def _latest_complete_iteration(root: str | os.PathLike) -> int | None:
    """The latest complete iteration directory of a root without a pointer file (None: no iteration at all).

    Raises:
        CheckpointError: there are iteration directories, none of them complete.
    """
    root = Path(root)
    iterations = sorted((int(m.group(1)) for m in map(ITERATION_DIR.match, os.listdir(root)) if m), reverse=True) \
        if root.is_dir() else []
    for iteration in iterations:
        if is_complete(checkpoint_dir(root, iteration)):
            if is_rank0():
                logger.warning("%s has no %s: using %s, its latest complete iteration directory", root, LATEST_FILE,
                               checkpoint_dir(root, iteration))
            return iteration
    if iterations:
        raise CheckpointError(f"{root} has no {LATEST_FILE} and none of its {len(iterations)} iteration directories "
                              f"is complete (the latest: {checkpoint_dir(root, iterations[0])})")
    return None


def remove_old_checkpoints(root: str | os.PathLike, keep: int, protected: frozenset[int] = frozenset()) -> list[int]:
    """Remove the complete checkpoints of ``root`` older than its latest ``keep`` complete ones, except the
    iterations ``protected`` (the one the run loaded from); call on one rank, after a save.

    Each is first renamed to its staging name (atomic), so a crash during the removal leaves a directory that
    no load takes for a checkpoint (the next save deletes it).

    Returns:
        The removed iterations.
    """
    root = Path(root)
    complete = sorted(iteration for iteration in (int(m.group(1)) for m in map(ITERATION_DIR.match, os.listdir(root))
                                                  if m) if is_complete(checkpoint_dir(root, iteration)))
    protected = protected | {latest_iteration(root)}
    removed = [iteration for iteration in complete[:-keep] if iteration not in protected]
    for iteration in removed:
        directory = checkpoint_dir(root, iteration)
        doomed = directory.with_name(directory.name + TEMP_SUFFIX)
        os.replace(directory, doomed)
        shutil.rmtree(doomed, ignore_errors=True)
        logger.info("removed checkpoint %s (keeping the latest %d)", directory, keep)
    return removed


def resolve_checkpoint(path: str | os.PathLike) -> tuple[Path, int]:
    """(root, iteration) of a checkpoint root (its latest iteration) or of one ``iter_XXXXXXX`` directory.

    Raises:
        CheckpointError: ``path`` holds no checkpoint.
    """
    path = Path(path)
    match = ITERATION_DIR.match(path.name)
    if match and (path / METADATA_FILE).is_file():
        return path.parent, int(match.group(1))
    iteration = latest_iteration(path)
    if iteration is None:
        raise CheckpointError(f"{path}: no checkpoint ({LATEST_FILE} not found)")
    return path, iteration


def one_line(error: BaseException) -> str:
    """``Type: first line of the message`` (a damaged file is named by the caller)."""
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0]}" if text else type(error).__name__
