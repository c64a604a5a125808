"""A collective that waits past ``--distributed-timeout-minutes`` (Megatron's flag) ends the run with one line.

The process group gets the timeout (`process_group_timeout`, passed to ``dist.init_process_group``); a rank whose
collective outlives it gets the backend's error, which `reported_timeouts` turns into a `CollectiveTimeoutError`
naming that rank, what it waited for and the last completed iteration, instead of a C++ frame's text:

    with reported_timeouts(config.launch.distributed_timeout_minutes, rank, lambda: run.completed_iteration):
        run.train()

gloo's error (``Timed out waiting 3000ms for recv operation to complete``) does not say which peer did not
arrive, so neither does the line: it names the rank that waited and the operation it waited on.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator
from datetime import timedelta

from trainer.errors import CollectiveTimeoutError

# gloo's timeout (third_party/gloo/gloo/transport/tcp/unbound_buffer.cc): milliseconds and "send" / "recv".
GLOO_TIMEOUT = re.compile(r"Timed out waiting (?P<ms>\d+)ms for (?P<operation>\w+) operation to complete")


def process_group_timeout(minutes: float) -> timedelta:
    """``distributed_timeout_minutes`` as the ``timeout`` of ``dist.init_process_group``."""
    return timedelta(minutes=minutes)


def timeout_message(error: BaseException, minutes: float, rank: int, completed_iteration: int | None) -> str | None:
    """The one line for ``error`` when it is a collective's timeout (None otherwise).

    ``completed_iteration``: the last iteration whose step finished on this rank (None: the step loop had not
    started).
    """
    match = GLOO_TIMEOUT.search(str(error))
    if match is None:
        return None
    progress = ("before the step loop started" if completed_iteration is None
                else f"the last completed iteration is {completed_iteration}")
    return (f"rank {rank} timed out after {minutes:g} min (distributed_timeout_minutes) waiting for a "
            f"{match['operation']} of a collective: another rank did not arrive (gloo does not say which; look for a "
            f"stalled or dead process); {progress}")


@contextlib.contextmanager
def reported_timeouts(minutes: float, rank: int, completed_iteration: Callable[[], int | None]) -> Iterator[None]:
    """Turn a collective's timeout inside the block into a `CollectiveTimeoutError` (other errors pass).

    Raises:
        CollectiveTimeoutError: a collective of this rank waited ``minutes`` for another rank.
    """
    try:
        yield
    except RuntimeError as error:  # gloo raises a plain RuntimeError (torch's DistError derives from it)
        message = timeout_message(error, minutes, rank, completed_iteration())
        if message is None:
            raise
        raise CollectiveTimeoutError(message) from None
