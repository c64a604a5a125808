"""Each rank's records in the process group's store (`trainer.parallel.rank_progress`): after a collective's
timeout, the rank that waited names the ranks that did not arrive: a rank whose beat stands still (stopped, hung
or dead), or a running one whose record is behind; a running rank at the same phase is not named. The record
of a step costs a few microseconds (one store ``set``, which waits for no reply). NCCL's timeout (raised where
the rank waits under TORCH_NCCL_BLOCKING_WAIT) becomes the same line as gloo's.
"""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
import torch.distributed as dist

from trainer.errors import CollectiveTimeoutError
from trainer.parallel.collective_timeout import reported_timeouts
from trainer.parallel.rank_progress import RankProgress

WORLD_SIZE = 3
GLOO_RECV_TIMEOUT = "Timed out waiting 6000ms for recv operation to complete"
# `WorkNCCL::checkTimeout`'s text (torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp).
NCCL_TIMEOUT = ("[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=12, OpType=ALLREDUCE, "
                "NumelIn=1, NumelOut=1, Timeout(ms)=6000) ran for 6012 milliseconds before timing out.")
# What one step's record may cost (measured: 4-13 us, median 9 us, on a 2-core machine under load; a step takes
# milliseconds for the tiny test model and seconds for a real one).
RECORD_BUDGET_S = 500e-6
RECORDS_TIMED = 1000


@pytest.fixture
def store():
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                           timeout=timedelta(seconds=10))
    yield dist.PrefixStore("tokenmill/attempt_0", dist.TCPStore("127.0.0.1", server.port, is_master=False))


def _stopped(store, rank: int, iteration: int, phase: str) -> RankProgress:
    """A rank whose record says ``phase`` of ``iteration`` and whose beat thread never runs (a stopped process)."""
    progress = RankProgress(store, rank, WORLD_SIZE)
    progress.enter(iteration, phase)
    return progress


@pytest.mark.timeout(60)
def test_a_stopped_rank_and_a_rank_behind_are_named_a_rank_beside_is_not(store):
    _stopped(store, 1, 3, "step")
    with RankProgress.open(store, 0, WORLD_SIZE) as waiting, RankProgress.open(store, 2, WORLD_SIZE) as beside:
        waiting.enter(3, "step")
        beside.enter(3, "step")
        absent = waiting.absent_ranks()
        assert [rank.describe() for rank in absent] == [
            "rank 1 did not arrive: it has not run for 3 s (stopped, hung or dead), it is in the step of iteration 3 "
            "and its last completed iteration is 2"]
        beside.enter(2, "save")  # running, but still in the save after iteration 2
        assert [rank.describe() for rank in waiting.absent_ranks()] == [
            "rank 1 did not arrive: it has not run for 3 s (stopped, hung or dead), it is in the step of iteration 3 "
            "and its last completed iteration is 2",
            "rank 2 did not arrive: it is in the save after iteration 2 and its last completed iteration is 2"]
        waiting.enter(10, "final evaluations")
        beside.enter(10, "save")
        assert [rank.describe() for rank in waiting.absent_ranks()][1:] == [
            "rank 2 did not arrive: it is in the save after iteration 10 and its last completed iteration is 10"]
        beside.enter(10, "final evaluations")
        assert [rank.rank for rank in waiting.absent_ranks()] == [1]


@pytest.mark.timeout(60)
def test_the_timeout_line_names_the_absent_rank(store):
    _stopped(store, 2, 0, "setup")
    with RankProgress.open(store, 0, WORLD_SIZE) as waiting, RankProgress.open(store, 1, WORLD_SIZE) as beside:
        waiting.enter(5, "evaluation")
        beside.enter(5, "evaluation")
        with pytest.raises(CollectiveTimeoutError) as raised:
            with reported_timeouts(0.1, 0, lambda: 5, waiting):
                raise RuntimeError(f"[gloo/transport/tcp/unbound_buffer.cc:78] {GLOO_RECV_TIMEOUT}")
    assert str(raised.value) == (
        "rank 0 timed out after 0.1 min (distributed_timeout_minutes) waiting for a recv of a collective (the last "
        "completed iteration is 5): rank 2 did not arrive: it has not run for 3 s (stopped, hung or dead), it has "
        "not started its first step")


def test_an_nccl_timeout_is_the_same_line():
    with pytest.raises(CollectiveTimeoutError, match=r"^rank 0 timed out after 0.1 min \(distributed_timeout_minutes\) "
                       r"waiting for an NCCL ALLREDUCE collective: .* the last completed iteration is 4$"):
        with reported_timeouts(0.1, 0, lambda: 4):
            raise dist.DistBackendError(NCCL_TIMEOUT)


def test_one_process_keeps_no_records():
    with RankProgress.open(None, 0, 1) as progress:
        assert progress is None


def test_a_step_record_costs_a_few_microseconds(store):
    with RankProgress.open(store, 0, WORLD_SIZE) as progress:
        started = time.perf_counter()
        for iteration in range(RECORDS_TIMED):
            progress.enter(iteration, "step")
        per_record = (time.perf_counter() - started) / RECORDS_TIMED
    assert per_record < RECORD_BUDGET_S, per_record
