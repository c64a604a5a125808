"""The one multi-process launcher of the trainer tests: ``(function, args, kwargs)`` jobs run in turn in
``world_size`` spawned gloo CPU processes, under a timeout.

Starting a CPU process that imports the trainer costs seconds (four at once on two cores, about six), and a job
of a tiny model less. So the processes of a world size are kept between launches, a pool per world size, and each
launch is as a fresh start would be to its jobs: the test's environment variables and working directory, one
intra-op thread, torch.compile's caches emptied, and a process group of its own (created for the launch, over a
new port, destroyed after it; DTensor's cached sharding decisions, which hold the meshes of earlier groups,
emptied). Several jobs share one launch and its group (each job builds its own mesh). A launch that fails, hangs
past its time limit or is interrupted ends its pool (processes killed, never left running); the next launch starts
a new one. The pools end with the session.

The functions must be importable module-level functions (the processes are spawned) that return
JSON-serialisable results.
"""

from __future__ import annotations

import atexit
import json
import multiprocessing.queues
import os
import pickle
import queue
import socket
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.tensor import DTensor

# Intra-op threads of every launched rank and of every in-process run of the trainer tests (conftest pins them; a
# subprocess whose results are compared bit for bit with an in-process run sets the same): one, torchrun's default
# for several processes a node. A CPU matmul's rounding depends on the thread count.
TEST_THREADS = 1
# Seconds a whole multi-process launch may take before its processes are killed.
LAUNCH_TIMEOUT_S = 420
# How often a waiting side looks at the other: the parent at its workers' liveness, an idle worker at its parent's.
POLL_S = 1.0
# One job of a multi-process run: a module-level function, its positional and keyword arguments.
Job = tuple[Callable[..., Any], tuple, dict]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _forget_earlier_meshes() -> None:
    """Empty DTensor's caches of sharding decisions, as a fresh process has them: a cached decision holds the mesh
    it was made on, and a mesh equals any other of the same ranks and dim names whatever its process groups, so a
    decision of an earlier launch could name one of that launch's groups, gone since."""
    DTensor._op_dispatcher.sharding_propagator.propagate_op_sharding.cache_clear()
    clear_fast_path = getattr(torch._C, "_clear_DTensor_sharding_propagator_cache", None)  # (the C++ fast path's)
    if clear_fast_path is not None:
        clear_fast_path()


def _run_launch(rank: int, world_size: int, port: int, environment: dict[str, str], cwd: str, jobs: list[Job],
                out: str) -> None:
    """One launch in a pool worker: a fresh process's view (environment, directory, threads, compile and sharding
    caches) and a process group of its own for ``jobs``; rank 0 writes their results to ``out`` as JSON."""
    os.environ.clear()
    os.environ.update(environment, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank))
    os.chdir(cwd)
    torch.set_num_threads(TEST_THREADS)
    torch._dynamo.reset()
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    _forget_earlier_meshes()
    try:
        results = [function(*args, **kwargs) for function, args, kwargs in jobs]
    finally:
        dist.destroy_process_group()
    if rank == 0:
        Path(out).write_text(json.dumps(results))


def _serve(rank: int, world_size: int, parent: int, inbox: multiprocessing.queues.Queue,
           outbox: multiprocessing.queues.Queue) -> None:
    """A pool worker: runs each launch its inbox brings and answers ``(rank, error or None)``; ends after a failed
    launch (its process group may be stuck: the parent kills the pool) or when its parent is gone."""
    while True:
        try:
            launch = inbox.get(timeout=POLL_S)
        except queue.Empty:
            if os.getppid() != parent:
                return
            continue
        try:
            _run_launch(rank, world_size, *pickle.loads(launch))
        except BaseException:
            outbox.put((rank, traceback.format_exc()))
            return
        outbox.put((rank, None))


class _Pool:
    """``world_size`` spawned workers, each with an inbox; one outbox for their answers."""

    def __init__(self, world_size: int) -> None:
        context = mp.get_context("spawn")
        self.world_size = world_size
        self.inboxes = [context.Queue() for _ in range(world_size)]
        self.outbox = context.Queue()
        # Not daemonic: a job may start processes of its own. The workers end when the pool is closed, or by
        # themselves when the parent is gone.
        self.processes = [context.Process(target=_serve, args=(rank, world_size, os.getpid(), inbox, self.outbox))
                          for rank, inbox in enumerate(self.inboxes)]
        for process in self.processes:
            process.start()

    def launch(self, jobs: list[Job], out: Path) -> None:
        """Run ``jobs`` on every worker; returns when all have answered.

        Raises:
            TimeoutError: not every worker answered within LAUNCH_TIMEOUT_S.
            RuntimeError: a worker failed a job (its traceback) or died.
        """
        # Pickled here by the standard pickler: tensors among the jobs' arguments travel as bytes, where the queue's
        # own pickler would pass their storage as file descriptors through a listener in a temporary folder of the
        # parent's (left behind for the interpreter's exit, after pytest has removed the folder).
        message = pickle.dumps((free_port(), dict(os.environ), os.getcwd(), jobs, str(out)))
        for inbox in self.inboxes:
            inbox.put(message)
        deadline = time.monotonic() + LAUNCH_TIMEOUT_S
        answered: set[int] = set()
        errors: dict[int, str] = {}
        while len(answered) < self.world_size:
            try:
                rank, error = self.outbox.get(timeout=POLL_S)
            except queue.Empty:
                if errors:
                    break
                dead = [rank for rank, process in enumerate(self.processes) if not process.is_alive()]
                if dead:
                    raise RuntimeError(f"{self.world_size}-process run: rank {dead[0]} died "
                                       f"(exit code {self.processes[dead[0]].exitcode})") from None
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{self.world_size}-process run did not finish in {LAUNCH_TIMEOUT_S} s") \
                        from None
                continue
            answered.add(rank)
            if error is not None:
                errors[rank] = error
        if errors:
            # Every rank that failed within a poll of the first: the rank whose job raised, and the peers its
            # leaving broke (which may answer first).
            raise RuntimeError("\n".join(f"{self.world_size}-process run: rank {rank} failed:\n{error}"
                                         for rank, error in sorted(errors.items())))

    def close(self) -> None:
        """Kill the workers (a closed pool is never used again)."""
        for process in self.processes:
            if process.is_alive():
                process.kill()
        for process in self.processes:
            process.join()
        for channel in (*self.inboxes, self.outbox):
            channel.close()
            channel.join_thread()


_pools: dict[int, _Pool] = {}


def close_pools() -> None:
    """Kill every pool's workers (registered with atexit: the session's end)."""
    while _pools:
        _pools.popitem()[1].close()


atexit.register(close_pools)


def run_jobs(world_size: int, jobs: list[Job], workdir: Path) -> list:
    """Run ``jobs`` one after another in ``world_size`` gloo processes.

    Returns:
        Rank 0's results, one per job (through a JSON file in ``workdir``).

    Raises:
        TimeoutError: the launch exceeded LAUNCH_TIMEOUT_S (processes are killed, never left hanging).
        RuntimeError: a job raised in some process, or a process died.
    """
    out = workdir / f"results-{time.monotonic_ns()}.json"
    pool = _pools.get(world_size)
    if pool is None:
        pool = _pools[world_size] = _Pool(world_size)
    try:
        pool.launch(jobs, out)
    except BaseException:
        del _pools[world_size]
        pool.close()
        raise
    return json.loads(out.read_text())
