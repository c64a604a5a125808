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
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def free_disk_bytes(path: str) -> int:
    """Free bytes of the file system that holds `path`, or would hold it (its nearest existing folder)."""
    path = os.path.abspath(path)
    while not os.path.exists(path):
        path = os.path.dirname(path)
    return shutil.disk_usage(path).free


def format_gib(num_bytes: int) -> str:
    """`num_bytes` as GiB with one decimal, e.g. "20.4 GiB"."""
    return f"{num_bytes / GIB:.1f} GiB"
