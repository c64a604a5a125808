"""Room on the disk for a large write: a check before it starts, and one line when the disk fills anyway.

    shortfall = free_space_shortfall(directory, needed_bytes)   # None when it fits
    if is_disk_full(error): raise CheckpointError(no_space_message(directory, needed_bytes))

The free space is ``shutil.disk_usage`` of the nearest existing folder (the target may not exist yet); the
disk is named by its mount point, so that the user knows which one to clear.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from indexed_dataset.machine import free_disk_bytes, nearest_existing

# errno values of a write refused for want of room: the disk is full, or the user's quota is.
_DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


def mount_point(path: str | os.PathLike) -> Path:
    """The mount point of the disk that holds (or would hold) ``path``."""
    path = Path(nearest_existing(path))
    while not os.path.ismount(path) and path != path.parent:
        path = path.parent
    return path


def no_space_message(path: str | os.PathLike, needed_bytes: int) -> str:
    """``<path>: no room on the disk mounted at <mount>: about N bytes needed, M free``."""
    return (f"{path}: no room on the disk mounted at {mount_point(path)}: about {needed_bytes:,} bytes needed, "
            f"{free_disk_bytes(path):,} free")


def free_space_shortfall(path: str | os.PathLike, needed_bytes: int) -> str | None:
    """`no_space_message` when the disk of ``path`` has less than ``needed_bytes`` free, else None."""
    return no_space_message(path, needed_bytes) if free_disk_bytes(path) < needed_bytes else None


def is_disk_full(error: BaseException) -> bool:
    """True for an OSError that says the disk (or the user's quota) is full."""
    return isinstance(error, OSError) and error.errno in _DISK_FULL_ERRNOS
