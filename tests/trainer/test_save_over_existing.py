"""``--save`` never writes over another run, and ``--load`` never mistakes a broken pointer for "no checkpoint".

Promised (issues 26 and 34):
- ``train --save D`` without ``--load D``, where D holds another run (checkpoints, an ``iter_*`` directory,
  a metrics.jsonl), is refused in one line that names D and says how to resume (``--load D``) or start over
  (``--overwrite-save``); D is unchanged. The same for ``finetune --save D`` over another fine-tuning run.
- ``--overwrite-save`` really starts over: D then holds the new run only (its checkpoints, its pointer, a
  metrics.jsonl with the new run's records only).
- Two runs saving into one D at once: the second is refused in one line naming the lock file and the holder's
  pid; a lock left by a dead process does not block.
- ``train --load D`` whose ``latest_checkpointed_iteration.txt`` is missing resumes from the latest complete
  ``iter_*`` directory and says which; a pointer that is a symlink loop, a dangling link or garbage is refused
  in one line naming it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from save_testing import error_lines, run_argv, tree_digest

from trainer.checkpoint.store import LATEST_FILE, checkpoint_dir
from trainer.checkpoint.manifest import MANIFEST_FILE
from trainer.cli.train import main as train_main
from trainer.checkpoint.save_directory import LOCK_FILE

REPO = Path(__file__).resolve().parents[2]
RUN_TIMEOUT_S = 240


@pytest.fixture(scope="module")
def saved_run(tiny_prefix, cache_dir, tmp_path_factory) -> Path:
    """A finished tiny run: checkpoints at iterations 2 and 4, its pointer, metrics.jsonl, model_config.json."""
    root = tmp_path_factory.mktemp("saved") / "run"
    assert train_main(run_argv(tiny_prefix, cache_dir, train_iters=4, save_interval=2, save=str(root))) == 0
    return root


def _copy(saved_run: Path, tmp_path: Path) -> Path:
    root = tmp_path / "run"
    shutil.copytree(saved_run, root, symlinks=True)
    return root


def _refused(argv: list[str], capsys, main=train_main) -> str:
    """Run ``main(argv)``; assert a non-zero exit, no traceback and exactly one error line; return it."""
    code = main(argv)
    err = capsys.readouterr().err
    assert code != 0, err
    assert "Traceback" not in err, err
    lines = error_lines(err)
    assert len(lines) == 1, err
    return lines[0]


# -- another run in --save --------------------------------------------------------------------------------

def _only_metrics(root: Path) -> None:
    for path in root.iterdir():
        if path.name != "metrics.jsonl":
            shutil.rmtree(path) if path.is_dir() else path.unlink()


def _no_pointer(root: Path) -> None:
    (root / LATEST_FILE).unlink()


OTHER_RUNS = {"checkpoints": lambda root: None, "metrics-only": _only_metrics,
              "iterations-without-pointer": _no_pointer}


@pytest.mark.timeout(RUN_TIMEOUT_S)
@pytest.mark.parametrize("leftover", sorted(OTHER_RUNS))
@pytest.mark.parametrize("load", ["none", "another"])
def test_save_into_another_run_is_refused(leftover, load, saved_run, tiny_prefix, cache_dir, tmp_path, capsys):
    root = _copy(saved_run, tmp_path)
    OTHER_RUNS[leftover](root)
    before = tree_digest(root)
    other = str(tmp_path / "empty") if load == "another" else None
    if other:
        os.mkdir(other)
    line = _refused(run_argv(tiny_prefix, cache_dir, save=str(root), load=other), capsys)
    assert str(root) in line and "--load" in line and "--overwrite-save" in line, line
    assert tree_digest(root) == before


@pytest.mark.timeout(RUN_TIMEOUT_S)
def test_overwrite_save_starts_a_fresh_run(saved_run, tiny_prefix, cache_dir, tmp_path):
    root = _copy(saved_run, tmp_path)
    (root / "notes.txt").write_text("the user's own file\n")
    assert train_main([*run_argv(tiny_prefix, cache_dir, train_iters=3, save=str(root)), "--overwrite-save"]) == 0
    assert (root / LATEST_FILE).read_text().strip() == "3"
    assert sorted(p.name for p in root.glob("iter_*")) == [checkpoint_dir(root, 3).name]
    records = [json.loads(line) for line in (root / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in records if "loss" in r] == [1, 2, 3]
    assert (root / "notes.txt").read_text() == "the user's own file\n"


@pytest.mark.timeout(RUN_TIMEOUT_S)
def test_overwrite_save_of_the_run_being_resumed_is_refused(saved_run, tiny_prefix, cache_dir, tmp_path, capsys):
    root = _copy(saved_run, tmp_path)
    before = tree_digest(root)
    argv = [*run_argv(tiny_prefix, cache_dir, train_iters=5, save=str(root), load=str(root)), "--overwrite-save"]
    line = _refused(argv, capsys)
    assert "--overwrite-save" in line and "--load" in line and str(root) in line, line
    assert tree_digest(root) == before


@pytest.mark.timeout(RUN_TIMEOUT_S)
def test_resuming_into_the_same_directory_still_works(saved_run, tiny_prefix, cache_dir, tmp_path):
    root = _copy(saved_run, tmp_path)
    assert train_main(run_argv(tiny_prefix, cache_dir, train_iters=5, save=str(root), load=str(root))) == 0
    assert (root / LATEST_FILE).read_text().strip() == "5"


@pytest.mark.timeout(RUN_TIMEOUT_S)
def test_finetune_save_into_another_finetuning_run_is_refused(data_test, tmp_path, capsys):
    from trainer.models.bert.squad.finetune_cli import main as finetune_main

    sample = str(data_test / "squad" / "squad_sample.json")
    vocab = str(data_test / "tokenizers" / "wordpiece-vocab.txt")
    argv = ["--task", "squad", "--train-file", sample, "--vocab-file", vocab,
            "--save", str(tmp_path / "ckpt"), "--epochs", "0.2", "--micro-batch-size", "8", "--num-layers", "1",
            "--hidden-size", "32", "--num-attention-heads", "4", "--ffn-hidden-size", "64", "--max-seq-length", "40",
            "--doc-stride", "8", "--max-query-length", "16", "--device", "cpu"]
    assert finetune_main(argv) == 0
    capsys.readouterr()
    before = tree_digest(tmp_path / "ckpt")
    line = _refused(argv, capsys, finetune_main)
    assert str(tmp_path / "ckpt") in line and "--overwrite-save" in line, line
    assert tree_digest(tmp_path / "ckpt") == before
    assert finetune_main([*argv, "--overwrite-save"]) == 0


# -- one run at a time ------------------------------------------------------------------------------------

HOLD_LOCK = """
import sys, time
from trainer.checkpoint.save_directory import claim_save_directory
with claim_save_directory(sys.argv[1], is_holder=True):
    print("locked", flush=True)
    time.sleep(600)
"""


@pytest.mark.timeout(RUN_TIMEOUT_S)
def test_a_second_run_into_a_locked_directory_is_refused(saved_run, tiny_prefix, cache_dir, tmp_path, capsys):
    root = _copy(saved_run, tmp_path)
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(root)], cwd=REPO, stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        before = tree_digest(root, ignore=())
        line = _refused(run_argv(tiny_prefix, cache_dir, train_iters=5, save=str(root), load=str(root)), capsys)
        assert str(root / LOCK_FILE) in line and f"pid {holder.pid}" in line, line
        assert tree_digest(root, ignore=()) == before
    finally:
        holder.kill()
        holder.wait(RUN_TIMEOUT_S)
    # The holder died without unlocking: its lock does not block the next run.
    assert train_main(run_argv(tiny_prefix, cache_dir, train_iters=5, save=str(root), load=str(root))) == 0


@pytest.mark.timeout(RUN_TIMEOUT_S + 60)
def test_two_processes_of_one_run_share_the_lock_and_a_second_run_is_refused(saved_run, tiny_prefix, cache_dir,
                                                                             tmp_path):
    """Rank 0 alone takes the lock (the two processes of one run do not lock each other out); a second run of
    two processes is refused by every rank, shown once."""
    root = _copy(saved_run, tmp_path)
    argv = [sys.executable, "-m", "trainer.cli.train",
            *run_argv(tiny_prefix, cache_dir, train_iters=5, save=str(root), load=str(root)),
            "--nproc-per-node", "2", "--master-port", "0"]
    first = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert first.returncode == 0, first.stderr
    assert (root / LATEST_FILE).read_text().strip() == "5"
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(root)], cwd=REPO, stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        before = tree_digest(root, ignore=())
        argv[argv.index("5")] = "6"
        second = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    finally:
        holder.kill()
        holder.wait(RUN_TIMEOUT_S)
    assert second.returncode != 0 and "Traceback" not in second.stderr, second.stderr
    lines = error_lines(second.stderr)
    assert len(lines) == 1 and str(root / LOCK_FILE) in lines[0] and f"pid {holder.pid}" in lines[0], second.stderr
    assert tree_digest(root, ignore=()) == before


# -- the pointer file -------------------------------------------------------------------------------------

@pytest.mark.timeout(RUN_TIMEOUT_S)
@pytest.mark.parametrize("latest_complete", [True, False], ids=["latest-complete", "latest-damaged"])
def test_a_missing_pointer_resumes_from_the_latest_complete_iteration(latest_complete, saved_run, tiny_prefix,
                                                                      cache_dir, tmp_path, caplog):
    root = _copy(saved_run, tmp_path)
    (root / LATEST_FILE).unlink()
    if not latest_complete:
        shard = next(checkpoint_dir(root, 4).glob("*.distcp"))
        shard.write_bytes(shard.read_bytes()[:10])
    expected = 4 if latest_complete else 2
    caplog.set_level("INFO")
    assert train_main(run_argv(tiny_prefix, cache_dir, train_iters=6, save=str(root), load=str(root))) == 0
    assert f"resuming from iteration {expected} " in caplog.text
    assert str(checkpoint_dir(root, expected)) in caplog.text and LATEST_FILE in caplog.text


def _loop(pointer: Path) -> None:
    pointer.unlink()
    pointer.symlink_to(pointer.name)


def _dangling(pointer: Path) -> None:
    pointer.unlink()
    pointer.symlink_to("nowhere.txt")


def _garbage(pointer: Path) -> None:
    pointer.write_bytes(b"\xff\xfe 4")


def _a_directory(pointer: Path) -> None:
    pointer.unlink()
    pointer.mkdir()


BROKEN_POINTERS = {"symlink-loop": _loop, "dangling-symlink": _dangling, "garbage": _garbage,
                   "directory": _a_directory}


@pytest.mark.timeout(RUN_TIMEOUT_S)
@pytest.mark.parametrize("broken", sorted(BROKEN_POINTERS))
def test_a_broken_pointer_is_refused_naming_it(broken, saved_run, tiny_prefix, cache_dir, tmp_path, capsys):
    root = _copy(saved_run, tmp_path)
    BROKEN_POINTERS[broken](root / LATEST_FILE)
    before = tree_digest(root)
    line = _refused(run_argv(tiny_prefix, cache_dir, train_iters=6, save=str(root), load=str(root)), capsys)
    assert str(root / LATEST_FILE) in line, line
    assert tree_digest(root) == before


@pytest.mark.timeout(RUN_TIMEOUT_S)
def test_iterations_without_a_complete_one_are_refused(saved_run, tiny_prefix, cache_dir, tmp_path, capsys):
    root = _copy(saved_run, tmp_path)
    (root / LATEST_FILE).unlink()
    for iteration in (2, 4):
        (checkpoint_dir(root, iteration) / MANIFEST_FILE).write_text("{}")
    before = tree_digest(root)
    line = _refused(run_argv(tiny_prefix, cache_dir, train_iters=6, save=str(root), load=str(root)), capsys)
    assert str(root) in line and LATEST_FILE in line, line
    assert tree_digest(root) == before
