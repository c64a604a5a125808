"""Process-group setup and the elastic launcher behind ``train --num-gpus-per-node N``.

`init_distributed` joins the process group a launcher describes in the environment (torchrun, our
own `launch`, or a group the caller already initialised) and otherwise runs as one plain process.
`launch` starts ``nproc_per_node`` workers through torch's elastic agent, which is what torchrun
does, with a static rendezvous at ``master_addr:master_port``. Node 0 says how many nodes it waits
for, the others wait for node 0 to listen; after ``dist_timeout`` seconds either gives up with one line.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import multiprocessing
import os
import signal
import socket
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.distributed.launcher.api as launcher_api
from torch.distributed.elastic.agent.server.api import RunResult, WorkerGroup
from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
from torch.distributed.launcher.api import LaunchConfig as ElasticLaunchConfig
from torch.distributed.launcher.api import elastic_launch

from trainer.config import LaunchConfig
from trainer.errors import RendezvousError, TrainConfigError

logger = logging.getLogger(__name__)

# Seconds between two attempts of a node > 0 to reach node 0's rendezvous port.
CONNECT_RETRY_S = 0.5
# Set by torch's elastic agent (our launcher, torchrun) in every worker: 0 on the first attempt, then 1, 2, ...
RESTART_COUNT_VARIABLE = "TORCHELASTIC_RESTART_COUNT"
# The prefix of one attempt's process-group keys in the launcher's store; each group of the attempt adds its number.
ATTEMPT_PREFIX = "tokenmill/attempt_"
GROUP_PREFIX = "/group_"
# The groups this process has created (`init_distributed`), numbered from 0. A script that runs `train` twice under
# torchrun creates two groups over the one store of the launcher: the second, meeting under the first's keys, read
# the addresses and progress records of a group already gone (and hung in its first collective). The ranks create
# their groups in step (each command is collective), so a group's number is the same on every rank.
_GROUP_NUMBERS = itertools.count()
# The per-run folder of the launcher's worker error files (under the system temp dir, removed at the end).
LAUNCH_LOG_PREFIX = "tokenmill_launch_"


@dataclass(frozen=True, slots=True)
class DistContext:
    """Where this process stands."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    owns_process_group: bool
    """True when `init_distributed` created the group and must destroy it."""
    store: dist.Store | None = None
    """The store the group's ranks met in, under this attempt's prefix (None: one process, or a group the caller
    initialised)."""


def resolve_device_type(device: str | None) -> str:
    """``cuda`` when asked for or available, else ``cpu``.

    Raises:
        TrainConfigError: cuda was asked for but is not available.
    """
    if device == "cuda" and not torch.cuda.is_available():
        raise TrainConfigError("device cuda was asked for but no CUDA device is available")
    return device or ("cuda" if torch.cuda.is_available() else "cpu")


def restart_count() -> int:
    """How many times the launcher has restarted the workers (0 outside a launcher)."""
    return int(os.environ.get(RESTART_COUNT_VARIABLE, "0") or 0)


def init_distributed(device_type: str, timeout: timedelta | None = None) -> DistContext:
    """Join the launcher's process group (gloo on CPU, NCCL on GPU), or run as one process.

    ``timeout``: how long a collective waits for the other ranks (``--distributed-timeout-minutes``); None is
    torch's default."""
    owns = False
    attempt_store = None
    if not dist.is_initialized() and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        # torch's launcher keeps one store for all its attempts (--max-restarts), and the process group's keys
        # carry no attempt: a restarted worker could read an address its dead predecessor published. Each
        # attempt's keys get a prefix of their own, and each group of an attempt too (`_GROUP_NUMBERS`).
        store, rank, world_size = next(dist.rendezvous("env://"))
        attempt_store = dist.PrefixStore(f"{ATTEMPT_PREFIX}{restart_count()}{GROUP_PREFIX}{next(_GROUP_NUMBERS)}",
                                         store)
        dist.init_process_group(backend="nccl" if device_type == "cuda" else "gloo", store=attempt_store, rank=rank,
                                world_size=world_size, timeout=timeout)
        owns = True
    rank = dist.get_rank() if dist.is_initialized() else 0
    world_size = dist.get_world_size() if dist.is_initialized() else 1
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if device_type == "cuda":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    return DistContext(rank=rank, world_size=world_size, local_rank=local_rank, device=device,
                       owns_process_group=owns, store=attempt_store)


def under_launcher() -> bool:
    """True inside torchrun/elastic workers (or an initialised group): do not launch again."""
    return dist.is_initialized() or "TORCHELASTIC_RUN_ID" in os.environ or "LOCAL_RANK" in os.environ


# Store key of the second phase of the agents' exit barrier (`_NodeAgent`), and how often the store's
# host looks at it.
_LEFT_EXIT_BARRIER_KEY = "tokenmill/agents_left_exit_barrier"
_EXIT_POLL_S = 0.05


class _NodeAgent(LocalElasticAgent):
    """torch's node agent, with two differences.

    - The agent hosting the rendezvous store (group rank 0, node 0) leaves the exit barrier only after every other
      agent has left it. In torch's barrier the last agent to arrive sets a key the others wait for. When that is
      node 0, it returns at once and its process exits, closing the store, while another node's agent may still
      be waiting for the store's reply: that node then prints a C++ stack trace and "Error waiting on exit
      barrier" although every worker succeeded. Here each agent checks out after the barrier, and node 0 waits
      for all check-outs (at most the barrier's own timeout) before it lets the store go.
    - Once a worker has exited, the stopped ones are woken (`_monitor_workers`).
    """

    def _monitor_workers(self, worker_group: WorkerGroup) -> RunResult:
        # When a worker has exited, torch's poll sends the others SIGTERM and waits up to 30 s before its SIGKILL.
        # A stopped worker (SIGSTOP: a debugger, a suspended job, a stalled-rank test) holds the SIGTERM until it
        # runs again, so the run would sit out the whole grace period: wake every worker first, as a shell's `kill`
        # does (SIGCONT changes nothing for a running one).
        if self._pcontext is not None:
            pids = list(self._pcontext.pids().values())
            if any(_has_exited(pid) for pid in pids):
                for pid in pids:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGCONT)
        return super()._monitor_workers(worker_group)

    def _exit_barrier(self) -> None:
        super()._exit_barrier()
        group = self._worker_group
        if group.group_world_size == 1:
            return
        try:
            self._store.add(_LEFT_EXIT_BARRIER_KEY, 1)
            if group.group_rank == 0:
                deadline = time.monotonic() + self._exit_barrier_timeout
                while (self._store.add(_LEFT_EXIT_BARRIER_KEY, 0) < group.group_world_size
                       and time.monotonic() < deadline):
                    time.sleep(_EXIT_POLL_S)
        except dist.DistError as error:  # a node went away after its workers finished: nothing left to do
            logger.warning("node %d: leaving the exit barrier without the other nodes (%s)", group.group_rank, error)


def _has_exited(pid: int) -> bool:
    """Whether the child process ``pid`` has ended (without reaping it: its parent's bookkeeping stays intact)."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:  # already reaped
        return True


@contextlib.contextmanager
def _our_node_agent() -> Iterator[None]:
    """`elastic_launch` with `_NodeAgent` as its node agent (torch's launcher takes no agent class)."""
    original = launcher_api.LocalElasticAgent
    launcher_api.LocalElasticAgent = _NodeAgent
    try:
        yield
    finally:
        launcher_api.LocalElasticAgent = original


def launch(config: LaunchConfig, entrypoint: Callable[..., int], *args: object,
           forward_signal: signal.Signals | None = None) -> dict[int, int]:
    """Run ``entrypoint(*args)`` in ``num_gpus_per_node`` processes on this node; up to ``max_restarts`` times
    again, all of them, when one fails.

    ``forward_signal`` (the workers' exit signal, `trainer.checkpoint.early_exit`) is passed on to the workers
    instead of stopping them: they finish their step, save and return.

    Returns:
        Each local rank's return value.

    Raises:
        torch.distributed.elastic.multiprocessing.errors.ChildFailedError: a worker failed.
    """
    if config.master_port == 0:
        # torchrun --standalone: a c10d store on a free local port.
        rendezvous = {"rdzv_backend": "c10d", "rdzv_endpoint": "localhost:0",
                      "rdzv_configs": {"timeout": config.dist_timeout}}
    else:
        rendezvous = {"rdzv_backend": "static", "rdzv_endpoint": f"{config.master_addr}:{config.master_port}",
                      "rdzv_configs": {"rank": config.node_rank, "timeout": config.dist_timeout}}
    logger.info("launching %d processes on node %d of %d", config.num_gpus_per_node, config.node_rank,
                config.num_nodes)
    if config.num_nodes > 1:
        _announce_or_await_node_0(config)
    # The launcher's per-run folder of worker error files (else a /tmp/torchelastic_* folder it never removes):
    # removed when the run ends; a failure's message is read from it before `elastic_launch` returns.
    try:
        with tempfile.TemporaryDirectory(prefix=LAUNCH_LOG_PREFIX) as log_dir, _our_node_agent(), \
                _signal_forwarded(forward_signal):
            elastic = ElasticLaunchConfig(
                min_nodes=config.num_nodes, max_nodes=config.num_nodes, nproc_per_node=config.num_gpus_per_node,
                run_id=f"tokenmill-{uuid.uuid4().hex[:8]}" if config.num_nodes == 1 else "tokenmill-train",
                max_restarts=config.max_restarts, signals_to_handle=_launcher_signals(forward_signal),
                start_method="spawn", logs_specs=DefaultLogsSpecs(log_dir=log_dir), **rendezvous)
            return elastic_launch(elastic, entrypoint)(*args)
    except dist.DistError as error:  # the rendezvous store timed out: not every node came
        raise RendezvousError(_rendezvous_failure(config, error)) from None


# The signals torch's launcher turns into "stop the workers" (its LaunchConfig.signals_to_handle default).
ELASTIC_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT")


@contextlib.contextmanager
def _signal_forwarded(forwarded: signal.Signals | None) -> Iterator[None]:
    """While the block runs, ``forwarded`` reaching this process is sent on to its worker processes, and the
    launcher goes on waiting for them (torch's launcher must be told to leave that signal alone:
    `_launcher_signals`)."""
    if forwarded is None:
        yield
        return
    def forward(signal_number: int, frame: object) -> None:
        # The workers are the launcher's multiprocessing children (torch's start_processes, "spawn").
        for child in multiprocessing.active_children():
            with contextlib.suppress(ProcessLookupError):
                os.kill(child.pid, signal_number)

    previous_handler = signal.signal(forwarded, forward)
    try:
        yield
    finally:
        signal.signal(forwarded, previous_handler)


def _launcher_signals(forwarded: signal.Signals | None) -> str:
    """The signals torch's launcher stops the workers on: its own, less the one passed on to them."""
    return ",".join(name for name in ELASTIC_SIGNALS if forwarded is None or name != forwarded.name)


def _endpoint(config: LaunchConfig) -> str:
    return f"{config.master_addr}:{config.master_port}"


def _announce_or_await_node_0(config: LaunchConfig) -> None:
    """Node 0: say who it waits for. Other nodes: wait until node 0 listens, so that a missing node 0
    is one line after ``dist_timeout`` seconds (torch's store client would print a C++ stack trace).

    Raises:
        RendezvousError: node 0 did not listen within ``dist_timeout`` seconds.
    """
    others = config.num_nodes - 1
    if config.node_rank == 0:
        logger.info("waiting for %d more node%s at %s (giving up after %d s)", others, "s" if others > 1 else "",
                    _endpoint(config), config.dist_timeout)
        return
    logger.info("waiting for node 0 at %s (giving up after %d s)", _endpoint(config), config.dist_timeout)
    deadline = time.monotonic() + config.dist_timeout
    while True:
        try:
            # Connecting and closing is harmless to the store server: it drops the empty connection.
            with socket.create_connection((config.master_addr, config.master_port), timeout=CONNECT_RETRY_S):
                return
        except OSError:
            if time.monotonic() >= deadline:
                raise RendezvousError(f"node 0 did not answer at {_endpoint(config)} within {config.dist_timeout} s "
                                      f"(dist_timeout): start node 0 (node_rank 0) with the same master_addr "
                                      f"and master_port") from None
            time.sleep(CONNECT_RETRY_S)


def _rendezvous_failure(config: LaunchConfig, error: Exception) -> str:
    """One line for a failed rendezvous (on several nodes: a timeout, with torch's count of who joined)."""
    if config.num_nodes == 1:
        return f"the rendezvous at {_endpoint(config)} failed: {error}"
    return (f"the rendezvous at {_endpoint(config)} gave up after {config.dist_timeout} s (dist_timeout): not all "
            f"{config.num_nodes} nodes came ({error}); start the same command on every node, node_rank 0 to "
            f"{config.num_nodes - 1}")
