"""The one multi-process launcher of the trainer tests: ``(function, args, kwargs)`` jobs run in turn in
``world_size`` spawned gloo CPU processes, under a timeout.

Several jobs share one launch (the process group is created once; each job builds its own mesh),
because starting a CPU process costs seconds and a job of a tiny model less. The functions must be
importable module-level functions (the children are spawned) that return JSON-serialisable results.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

# Seconds a whole multi-process launch may take before its processes are killed.
LAUNCH_TIMEOUT_S = 420
# One job of a multi-process run: a module-level function, its positional and keyword arguments.
Job = tuple[Callable[..., Any], tuple, dict]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world_size: int, port: int, jobs: list[Job], out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world_size),
                      LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        results = [function(*args, **kwargs) for function, args, kwargs in jobs]
    finally:
        dist.destroy_process_group()
    if rank == 0:
        Path(out).write_text(json.dumps(results))


def run_jobs(world_size: int, jobs: list[Job], workdir: Path) -> list:
    """Run ``jobs`` one after another in ``world_size`` gloo processes.

    Returns:
        Rank 0's results, one per job.

    Raises:
        TimeoutError: the launch exceeded LAUNCH_TIMEOUT_S (processes are killed, never left hanging).
    """
    out = workdir / f"results-{time.monotonic_ns()}.json"
    context = mp.start_processes(_worker, args=(world_size, free_port(), jobs, str(out)), nprocs=world_size,
                                 join=False, start_method="spawn")
    deadline = time.monotonic() + LAUNCH_TIMEOUT_S
    try:
        while not context.join(timeout=1):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{world_size}-process run did not finish in {LAUNCH_TIMEOUT_S} s")
    finally:
        for process in context.processes:
            if process.is_alive():
                process.kill()
    return json.loads(out.read_text())
