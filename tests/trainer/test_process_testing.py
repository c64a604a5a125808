"""The trainer tests' multi-process launcher (`process_testing.run_jobs`): its processes are kept between launches,
and each launch still sees what a fresh start would (the test's environment, one thread, a process group of its
own); a job that fails ends the launch with its rank's traceback, and the next launch runs on new processes."""

import os

import pytest
import torch
import torch.distributed as dist
from process_testing import TEST_THREADS, run_jobs

WORLD = 2
PROBE = "TOKENMILL_LAUNCH_PROBE"


def what_a_rank_sees() -> dict:
    return {"pid": os.getpid(), "probe": os.environ.get(PROBE), "cwd": os.getcwd(), "world": dist.get_world_size(),
            "threads": torch.get_num_threads()}


def fail_on_rank_1() -> None:
    if dist.get_rank() == 1:
        raise ValueError("rank 1's job failed")
    dist.barrier()  # rank 0 waits for a rank that will never come: the launch must still end


def test_launches_keep_their_processes_and_each_sees_the_tests_environment(tmp_path, monkeypatch):
    monkeypatch.setenv(PROBE, "first")
    [first] = run_jobs(WORLD, [(what_a_rank_sees, (), {})], tmp_path)
    monkeypatch.setenv(PROBE, "second")
    monkeypatch.chdir(tmp_path)
    torch.set_num_threads(TEST_THREADS + 1)  # (the test's own count is not the ranks')
    [second] = run_jobs(WORLD, [(what_a_rank_sees, (), {})], tmp_path)
    assert (first["probe"], second["probe"]) == ("first", "second")
    assert second["cwd"] == str(tmp_path)
    assert first["pid"] == second["pid"] != os.getpid()
    assert first["world"] == second["world"] == WORLD
    assert first["threads"] == second["threads"] == TEST_THREADS


def test_a_failed_job_ends_the_launch_with_its_traceback_and_the_next_launch_starts_afresh(tmp_path):
    [before] = run_jobs(WORLD, [(what_a_rank_sees, (), {})], tmp_path)
    with pytest.raises(RuntimeError, match=r"rank 1 failed:(.|\n)*ValueError: rank 1's job failed"):
        run_jobs(WORLD, [(fail_on_rank_1, (), {})], tmp_path)
    [after] = run_jobs(WORLD, [(what_a_rank_sees, (), {})], tmp_path)
    assert after["pid"] != before["pid"]
