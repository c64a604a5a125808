"""The ``save`` directory of a run: one run at a time, and never over another run's files.

    check_save_directory(save, load, overwrite_save)    # before anything is built: refuses another run's D
    with claim_save_directory(save, is_holder=rank == 0):
        ...                                             # train, saving into D

A directory that holds a run (a pointer file, an ``iter_*`` directory, a metrics.jsonl) is only written
into by the run that resumes it (``load`` is the same directory) or, with ``overwrite_save``, by a fresh
run that first deletes that run's files (`clear_previous_run`): its checkpoints, pointer, model_config.json,
tokenizer files and metrics.jsonl. Other files in the directory (the user's own) are kept.

The lock is an advisory OS lock (``fcntl.flock``) on `LOCK_FILE` in the directory, held by one process of
the run (rank 0): the kernel releases it when that process ends, however it ends, so a crashed run never
blocks the next one. The file holds the pid and host of its last holder, for the refusal's message.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import shutil
import socket
from collections.abc import Iterator
from pathlib import Path

from trainer.checkpoint.save import refuse_on_every_rank
from trainer.checkpoint.store import ITERATION_DIR, LATEST_FILE, MODEL_CONFIG_FILE, TEMP_SUFFIX
from trainer.checkpoint.lengths import SEQUENCE_LENGTHS_FILE
from trainer.errors import CheckpointError
from trainer.checkpoint.hf_files import TOKENIZER_FILES
from trainer.metrics.records import METRICS_FILE_NAME
from trainer.checkpoint.tokenizer_record import SETTINGS_FILE

logger = logging.getLogger(__name__)

LOCK_FILE = ".tokenmill-save.lock"
LOCK_FILE_MODE = 0o644
# Bytes of the lock file shown in a refusal: its "pid N on host" line (anything longer is not ours).
_HOLDER_BYTES = 256
# The files a run writes beside its iterations (with their temporary names): what `clear_previous_run` deletes.
_RUN_FILES = (LATEST_FILE, METRICS_FILE_NAME, MODEL_CONFIG_FILE, SEQUENCE_LENGTHS_FILE, SETTINGS_FILE,
              *TOKENIZER_FILES)


def _is_iteration(path: Path) -> bool:
    return ITERATION_DIR.match(path.name.removesuffix(TEMP_SUFFIX)) is not None


def previous_run(root: str | os.PathLike) -> str | None:
    """What in ``root`` shows that a run saved there (a file's name), or None for a directory without one."""
    root = Path(root)
    if not root.is_dir():
        return None
    names = (LATEST_FILE, METRICS_FILE_NAME)
    found = [name for name in names if os.path.lexists(root / name)]
    found += sorted(path.name for path in root.iterdir() if _is_iteration(path) and not path.name.endswith(TEMP_SUFFIX))
    return found[0] if found else None


def check_save_directory(save: str | os.PathLike | None, load: str | os.PathLike | None,
                         overwrite_save: bool) -> None:
    """Refuse to save into a directory that holds another run (changes nothing).

    Raises:
        CheckpointError: ``save`` holds a run that this one neither resumes (``load``) nor overwrites, or
            ``overwrite_save`` would delete the checkpoint that ``load`` resumes.
    """
    if save is None:
        return
    resumes = load is not None and Path(save).resolve() in _roots_of(Path(load).resolve())
    if overwrite_save and resumes:
        raise CheckpointError(f"overwrite_save would delete the run in {save} that `load` {load} resumes: give "
                              "one of them")
    if overwrite_save or resumes:
        return
    found = previous_run(save)
    if found is not None:
        raise CheckpointError(f"{save} holds another run ({Path(save) / found}): resume it with `load` {save}, "
                              f"save elsewhere, or start over with overwrite_save (deletes that run's checkpoints "
                              f"and {METRICS_FILE_NAME})")


def _roots_of(load: Path) -> tuple[Path, ...]:
    """The checkpoint roots a ``load`` path may resume: itself, and its parent when it names one iteration."""
    return (load, load.parent) if ITERATION_DIR.match(load.name) else (load,)


def clear_previous_run(root: str | os.PathLike) -> None:
    """Delete what a run wrote into ``root`` (``overwrite_save``): iterations, pointer, model config, tokenizer
    and metrics files; any other file stays. Call on one rank, holding the lock."""
    root = Path(root)
    if not root.is_dir():
        return
    removed = 0
    for path in root.iterdir():
        if _is_iteration(path) and path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.name.removesuffix(TEMP_SUFFIX) in _RUN_FILES and (path.is_file() or path.is_symlink()):
            path.unlink()
        else:
            continue
        removed += 1
    if removed:
        logger.info("overwrite_save: deleted the previous run's %d files and checkpoints in %s", removed, root)


@contextlib.contextmanager
def claim_save_directory(root: str | os.PathLike | None, is_holder: bool,
                         overwrite_save: bool = False) -> Iterator[None]:
    """Hold ``root``'s lock for the block, on the process ``is_holder`` (rank 0 when distributed; collective
    then: every rank learns whether the lock was taken). With ``overwrite_save`` the previous run's files are
    deleted once the lock is held.

    Raises:
        CheckpointError: another live process holds the lock, or the directory cannot be created (on every
            rank).
    """
    if root is None:
        yield
        return
    with contextlib.ExitStack() as stack:
        refusal = None
        if is_holder:
            try:
                stack.enter_context(_locked(Path(root)))
                if overwrite_save:
                    clear_previous_run(root)
            except (CheckpointError, OSError) as error:  # (an OSError names its path) every rank must raise
                refusal = str(error)
        refuse_on_every_rank(refusal)
        yield


@contextlib.contextmanager
def _locked(root: Path) -> Iterator[None]:
    """``flock`` on ``root/LOCK_FILE`` (creating ``root``); the file then names this process."""
    root.mkdir(parents=True, exist_ok=True)
    path = root / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT, LOCK_FILE_MODE)  # not inherited by the processes we start
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            if error.errno not in (errno.EWOULDBLOCK, errno.EACCES):
                raise
            holder = os.pread(fd, _HOLDER_BYTES, 0).decode("utf-8", "replace").strip() or "another process"
            raise CheckpointError(f"{path} is locked by a run saving into {root} ({holder}): wait for it to "
                                  "end, or save elsewhere") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock (the kernel does the same when the process dies)
