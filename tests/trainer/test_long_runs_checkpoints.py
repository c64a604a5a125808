"""Checkpoints of long runs: --keep-last-checkpoints K keeps the latest K complete checkpoints (never the
one the run loaded from, never the last complete one); --async-save writes the same files as a synchronous
save while the steps go on, and a crash during an asynchronous save leaves the previous checkpoint the
latest (a load never takes the partial one).
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from long_runs_testing import EXIT_TIMEOUT_S, REPO
from process_testing import TEST_THREADS
from trainer_testing import tiny_config

from trainer.checkpoint.manifest import MANIFEST_FILE
from trainer.checkpoint.store import LATEST_FILE, METADATA_FILE, checkpoint_dir, latest_iteration
from trainer.train import train

SAVE_INTERVAL = 2
# The iteration whose asynchronous save the crash test cuts short, and the exit code of that crash.
CRASH_AT = 4
CRASH_EXIT = 137


def _checkpointed(config, **changes):
    return dataclasses.replace(config, checkpoint=dataclasses.replace(config.checkpoint, **changes))


def _iterations(root: Path) -> list[str]:
    return sorted(path.name for path in root.iterdir() if path.name.startswith("iter_"))


@pytest.mark.parametrize("async_save", [False, True])
def test_keep_last_checkpoints_removes_the_older_ones(async_save, tiny_prefix, cache_dir, tmp_path):
    save = tmp_path / "run"
    config = tiny_config(tiny_prefix, cache_dir, save=str(save), save_interval=SAVE_INTERVAL)
    train(_checkpointed(config, keep_last_checkpoints=2, async_save=async_save))
    assert _iterations(save) == ["iter_0000008", "iter_0000010"]
    assert (save / LATEST_FILE).read_text().strip() == "10"


def test_keep_last_checkpoints_never_removes_the_one_loaded_from(tiny_prefix, cache_dir, tmp_path):
    save = tmp_path / "run"
    first = tiny_config(tiny_prefix, cache_dir, save=str(save), save_interval=SAVE_INTERVAL, train_iters=4)
    train(first)
    resumed = tiny_config(tiny_prefix, cache_dir, save=str(save), load=str(save), save_interval=SAVE_INTERVAL)
    train(_checkpointed(resumed, keep_last_checkpoints=1))
    assert _iterations(save) == ["iter_0000004", "iter_0000010"]


def test_an_async_save_writes_the_files_of_a_synchronous_one(tiny_prefix, cache_dir, tmp_path):
    results, roots = {}, {}
    for async_save in (False, True):
        roots[async_save] = tmp_path / f"async_{async_save}"
        config = tiny_config(tiny_prefix, cache_dir, save=str(roots[async_save]), save_interval=SAVE_INTERVAL)
        results[async_save] = train(_checkpointed(config, async_save=async_save))
    assert results[True].losses == results[False].losses
    assert _iterations(roots[True]) == _iterations(roots[False])
    for name in _iterations(roots[False]):
        sync_dir, async_dir = roots[False] / name, roots[True] / name
        names = sorted(path.name for path in sync_dir.iterdir())
        assert sorted(path.name for path in async_dir.iterdir()) == names
        # .metadata holds a save id of its own (every save's differs, synchronous or not), and so does the
        # manifest's digest of it; every tensor file is byte for byte the same.
        for file_name in set(names) - {METADATA_FILE, MANIFEST_FILE}:
            assert (async_dir / file_name).read_bytes() == (sync_dir / file_name).read_bytes(), file_name
    assert (roots[True] / LATEST_FILE).read_text() == (roots[False] / LATEST_FILE).read_text()


@pytest.mark.timeout(300)
def test_a_crash_during_an_async_save_leaves_the_previous_checkpoint_the_latest(reference, tiny_prefix, cache_dir,
                                                                               tmp_path):
    save = tmp_path / "run"
    script = textwrap.dedent(f"""
        import os, sys
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        import torch
        import trainer.checkpoint.async_save as async_save
        from trainer_testing import tiny_config
        from trainer.config import CheckpointConfig
        from trainer.train import train
        complete = async_save.complete_save

        def crash_before_completing(root, iteration, temp, group=None):
            if iteration == {CRASH_AT}:  # every shard is written; the process dies before the rename
                os._exit({CRASH_EXIT})
            complete(root, iteration, temp, group)

        async_save.complete_save = crash_before_completing
        torch.set_num_threads({TEST_THREADS})  # the in-process reference's: steps 1 and 2 are compared bit for bit
        config = tiny_config({tiny_prefix!r}, {cache_dir!r}, save={str(save)!r}, save_interval={SAVE_INTERVAL})
        config.checkpoint.async_save = True
        train(config)
    """)
    crashed = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True,
                             timeout=EXIT_TIMEOUT_S)
    assert crashed.returncode == CRASH_EXIT, crashed.stderr[-2000:]
    assert (save / f"iter_{CRASH_AT:07d}.tmp" / METADATA_FILE).exists()  # the partial one, all shards written
    assert not checkpoint_dir(save, CRASH_AT).exists()
    assert latest_iteration(save) == CRASH_AT - SAVE_INTERVAL
    resumed = train(tiny_config(tiny_prefix, cache_dir, save=str(save), load=str(save), eval_iters=1))
    assert resumed.losses == reference["losses"][CRASH_AT - SAVE_INTERVAL:]
    assert not list(save.glob("*.tmp"))
