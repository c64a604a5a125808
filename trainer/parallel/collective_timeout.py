"""A collective that waits past ``--distributed-timeout-minutes`` (Megatron's flag) ends the run with one line.

The process group gets the timeout (`process_group_timeout`, passed to ``dist.init_process_group``); a rank whose
collective outlives it gets the backend's error, which `reported_timeouts` turns into a `CollectiveTimeoutError`
naming that rank, what it waited for, the last completed iteration and the ranks that did not arrive, instead of
a C++ frame's text:

    with reported_timeouts(config.launch.distributed_timeout_minutes, rank, lambda: run.completed_iteration,
                           progress):
        run.train()

gloo's error (``Timed out waiting 3000ms for recv operation to complete``) does not say which peer did not
arrive: the ranks' records in the store (`trainer.parallel.rank_progress`) do, when they are readable; else the
line says that it cannot tell.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator
from datetime import timedelta

from trainer.errors import CollectiveTimeoutError
from trainer.parallel.rank_progress import AbsentRank, RankProgress

# gloo's timeout (third_party/gloo/gloo/transport/tcp/unbound_buffer.cc): milliseconds and "send" / "recv".
GLOO_TIMEOUT = re.compile(r"Timed out waiting (?P<ms>\d+)ms for (?P<operation>\w+) operation to complete")
# NCCL's (ProcessGroupNCCL.cpp, `WorkNCCL::checkTimeout`), raised in the waiting thread when the user sets
# TORCH_NCCL_BLOCKING_WAIT=1 (docs/long-runs.md: why train does not set it): "... collective operation timeout:
# WorkNCCL(SeqNum=7, OpType=ALLREDUCE, ...".
NCCL_TIMEOUT = re.compile(r"collective operation timeout: WorkNCCL\(SeqNum=\d+, OpType=(?P<operation>\w+)")
# The most absent ranks the line names one by one (a lost node takes all of its ranks: the rest are counted).
MAX_NAMED_RANKS = 8


def process_group_timeout(minutes: float) -> timedelta:
    """``distributed_timeout_minutes`` as the ``timeout`` of ``dist.init_process_group``."""
    return timedelta(minutes=minutes)


def _waited_for(error: BaseException) -> str | None:
    """What the backend's timeout ``error`` says the rank waited for (None: not a collective's timeout)."""
    gloo = GLOO_TIMEOUT.search(str(error))
    if gloo is not None:
        return f"a {gloo['operation']} of a collective"
    nccl = NCCL_TIMEOUT.search(str(error))
    return None if nccl is None else f"an NCCL {nccl['operation']} collective"


def is_timeout(error: BaseException) -> bool:
    """Whether ``error`` is a collective's timeout (gloo's or NCCL's)."""
    return _waited_for(error) is not None


def timeout_message(error: BaseException, minutes: float, rank: int, completed_iteration: int | None,
                    absent: list[AbsentRank] | None = None) -> str | None:
    """The one line for ``error`` when it is a collective's timeout (None otherwise).

    ``completed_iteration``: the last iteration whose step finished on this rank (None: the step loop had not
    started). ``absent``: the ranks that did not arrive (`RankProgress.absent_ranks`; None: unknown, no records).
    """
    waited_for = _waited_for(error)
    if waited_for is None:
        return None
    progress = ("before the step loop started" if completed_iteration is None
                else f"the last completed iteration is {completed_iteration}")
    waited = f"rank {rank} timed out after {minutes:g} min (distributed_timeout_minutes) waiting for {waited_for}"
    if absent is None:
        return (f"{waited}: another rank did not arrive (the backend does not say which; look for a stalled or "
                f"dead process); {progress}")
    if not absent:
        return (f"{waited} ({progress}): every other rank runs and has reached this rank's phase (a rank stuck "
                f"inside the phase, or ranks in different collectives)")
    named = "; ".join(rank.describe() for rank in absent[:MAX_NAMED_RANKS])
    more = f"; and {len(absent) - MAX_NAMED_RANKS} more ranks" if len(absent) > MAX_NAMED_RANKS else ""
    return f"{waited} ({progress}): {named}{more}"


@contextlib.contextmanager
def reported_timeouts(minutes: float, rank: int, completed_iteration: Callable[[], int | None],
                      progress: RankProgress | None = None) -> Iterator[None]:
    """Turn a collective's timeout inside the block into a `CollectiveTimeoutError` (other errors pass);
    ``progress`` gives the ranks' records that name the absent ranks (None: the line cannot name them).

    Raises:
        CollectiveTimeoutError: a collective of this rank waited ``minutes`` for another rank.
    """
    try:
        yield
    except RuntimeError as error:  # gloo raises a plain RuntimeError, NCCL a DistBackendError (a RuntimeError)
        if not is_timeout(error):
            raise
        absent = progress.absent_ranks() if progress is not None else None
        raise CollectiveTimeoutError(timeout_message(error, minutes, rank, completed_iteration(), absent)) from None
