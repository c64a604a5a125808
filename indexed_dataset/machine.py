"""What this machine can hold: its usable cores, the memory it can still give, the free space of a disk.

In the lowest room so that every command checks a size the same way before allocating or writing it
(`preprocess-data --workers`, the index builders of `build-indices` and `train`):

    if needed_bytes > available_memory_bytes(): refuse, naming `format_gib(needed_bytes)`
"""

from __future__ import annotations

import os
import shutil

GIB = 2**30
_KIB = 2**10


def usable_cores() -> int:
    """The cores this process may use (taskset, cgroups), else the machine's."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def available_memory_bytes() -> int:
    """Memory the system can give without swapping (Linux MemAvailable), else the physical memory."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * _KIB  # the file counts KiB
    except (OSError, ValueError, IndexError):
        pass
    return physical_memory_bytes()


def physical_memory_bytes() -> int:
    """This machine's physical memory (what every process here shares)."""
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def nearest_existing(path: str | os.PathLike) -> str:
    """`path` made absolute, or its nearest existing ancestor (where a file about to be written would live)."""
    path = os.path.abspath(path)
    while not os.path.exists(path) and path != os.path.dirname(path):
        path = os.path.dirname(path)
    return path


def free_disk_bytes(path: str | os.PathLike) -> int:
    """Free bytes of the file system that holds `path`, or would hold it (its nearest existing folder)."""
    return shutil.disk_usage(nearest_existing(path)).free


def format_gib(num_bytes: int) -> str:
    """`num_bytes` as GiB with one decimal, e.g. "20.4 GiB"."""
    return f"{num_bytes / GIB:.1f} GiB"
