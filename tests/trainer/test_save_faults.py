"""Faults while a checkpoint or an export is written, and checkpoints that lost files or gained some.

Promised (issues 26 and 34):
- A full disk while ``train`` saves (a pre-flight check on the free bytes, or ENOSPC partway through the
  write): one line naming the directory and the bytes needed, a non-zero exit, the staging ``iter_N.tmp``
  removed, the previous checkpoint and pointer unchanged. The same for ``convert-checkpoint --to-hf``: no
  partial output directory is left.
- SIGTERM or SIGINT while a checkpoint is written: the signal's one line and exit 143 / 130, no traceback,
  the previous checkpoint intact, no staging left.
- A tokenmill checkpoint whose manifest was deleted (and a tensor changed) is refused in one line naming the
  manifest, unless ``--no-verify``; a checkpoint from before manifests still loads.
- An unknown file inside a checkpoint's iteration directory: loaded, with a warning naming the file.
"""

from __future__ import annotations

import errno
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from save_testing import error_lines, run_argv, tree_digest

from trainer.checkpoint.store import LATEST_FILE, checkpoint_dir
from trainer.checkpoint.manifest import MANIFEST_FILE
from trainer.cli.train import main as train_main
from trainer.cli.convert import main as convert_main

REPO = Path(__file__).resolve().parents[2]
RUN_TIMEOUT_S = 240
SAVED = 2
# Items DCP writes before the simulated full disk strikes (the tiny model's checkpoint holds ~30).
ITEMS_BEFORE_FULL = 3


@pytest.fixture(scope="module")
def saved_run(tiny_prefix, cache_dir, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("saved") / "run"
    assert train_main(run_argv(tiny_prefix, cache_dir, train_iters=SAVED, save=str(root))) == 0
    return root


def _copy(saved_run: Path, tmp_path: Path) -> Path:
    root = tmp_path / "run"
    shutil.copytree(saved_run, root)
    return root


def _checkpoints(root: Path) -> dict[str, str]:
    """What a failed save must leave as it was: the iterations and the pointer (metrics.jsonl grows)."""
    return tree_digest(root, ignore=("metrics.jsonl", ".tokenmill-save.lock"))


def _failed(code: int, err: str) -> str:
    assert code != 0, err
    assert "Traceback" not in err, err
    lines = error_lines(err)
    assert len(lines) == 1, err
    return lines[0]


# -- a full disk ------------------------------------------------------------------------------------------

def _disk_fills_after(items: int, monkeypatch) -> None:
    """DCP's file writer raises ENOSPC, as a full disk does, after writing ``items`` items."""
    import torch.distributed.checkpoint.filesystem as filesystem

    original, written = filesystem._write_item, [0]

    def write_item(*args, **kwargs):
        written[0] += 1
        if written[0] > items:
            raise OSError(errno.ENOSPC, "No space left on device")
        return original(*args, **kwargs)

    monkeypatch.setattr(filesystem, "_write_item", write_item)


def _little_free_space(monkeypatch, free: int = 1000) -> None:
    import collections

    usage = collections.namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10 * free, 9 * free, free))


FULL_DISKS = {"enospc-partway": lambda mp: _disk_fills_after(ITEMS_BEFORE_FULL, mp),
              "free-space-check": _little_free_space}


@pytest.mark.timeout(RUN_TIMEOUT_S)
@pytest.mark.parametrize("disk", sorted(FULL_DISKS))
def test_a_full_disk_while_resuming_keeps_the_old_checkpoint(disk, saved_run, tiny_prefix, cache_dir, tmp_path,
                                                             capsys, monkeypatch):
    root = _copy(saved_run, tmp_path)
    before = _checkpoints(root)
    FULL_DISKS[disk](monkeypatch)
    code = train_main(run_argv(tiny_prefix, cache_dir, train_iters=SAVED + 1, save=str(root), load=str(root)))
    line = _failed(code, capsys.readouterr().err)
    assert str(root) in line and "bytes" in line, line
    assert not list(root.glob("*.tmp")), list(root.iterdir())
    assert _checkpoints(root) == before


@pytest.mark.timeout(RUN_TIMEOUT_S)
@pytest.mark.parametrize("disk", ["safetensors-enospc", "free-space-check"])
def test_a_full_disk_during_an_export_leaves_no_partial_directory(disk, saved_run, tmp_path, capsys, monkeypatch):
    import safetensors
    import safetensors.torch

    if disk == "free-space-check":
        _little_free_space(monkeypatch)
    else:
        def full(tensors, path, metadata=None):
            Path(path).write_bytes(b"\0" * 100)
            raise safetensors.SafetensorError('Error while serializing: IoError(Os { code: 28, kind: StorageFull, '
                                              'message: "No space left on device" })')

        monkeypatch.setattr(safetensors.torch, "save_file", full)
    before = tree_digest(saved_run)
    line = _failed(convert_main(["--from", str(saved_run), "--to-hf", str(tmp_path / "hf")]), capsys.readouterr().err)
    assert str(tmp_path / "hf") in line and "bytes" in line, line
    assert sorted(p.name for p in tmp_path.iterdir()) == [], list(tmp_path.iterdir())
    assert tree_digest(saved_run) == before


# -- a signal during a save -------------------------------------------------------------------------------

SIGNAL_DURING_SAVE = """
import os, signal, sys
import torch.distributed.checkpoint.filesystem as filesystem
from trainer.cli.train import main

original = filesystem._write_item
def write_item(transforms, stream, *args, **kwargs):
    if "iter_0000002.tmp" in str(getattr(stream, "name", "")):
        os.kill(os.getpid(), int(sys.argv[1]))
    return original(transforms, stream, *args, **kwargs)
filesystem._write_item = write_item
sys.exit(main(sys.argv[2:]))
"""


@pytest.mark.timeout(RUN_TIMEOUT_S)
@pytest.mark.parametrize("signal_number", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_during_a_save_is_one_line_and_keeps_the_last_checkpoint(signal_number, tiny_prefix, cache_dir,
                                                                          tmp_path):
    root = tmp_path / "run"
    argv = run_argv(tiny_prefix, cache_dir, train_iters=3, save=str(root), save_interval=1)
    run = subprocess.run([sys.executable, "-c", SIGNAL_DURING_SAVE, str(int(signal_number)), *argv], cwd=REPO,
                         capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    name = signal.Signals(signal_number).name
    assert run.returncode == 128 + signal_number, run.stderr
    assert "Traceback" not in run.stderr and "CheckpointException" not in run.stderr, run.stderr
    assert run.stderr.splitlines()[-1] == f"train: interrupted ({name}); nothing half-written was left", run.stderr
    assert (root / LATEST_FILE).read_text().strip() == "1"
    assert sorted(p.name for p in root.glob("iter_*")) == [checkpoint_dir(root, 1).name]


@pytest.mark.timeout(RUN_TIMEOUT_S)
def test_staging_left_by_a_killed_run_is_removed_by_the_next_save(saved_run, tiny_prefix, cache_dir, tmp_path):
    """A process killed outright (SIGKILL) cannot clean up: the next run's save removes its staging."""
    root = _copy(saved_run, tmp_path)
    stale = root / (checkpoint_dir(root, 7).name + ".tmp")
    stale.mkdir()
    (stale / "__0_0.distcp").write_bytes(b"half")
    assert train_main(run_argv(tiny_prefix, cache_dir, train_iters=SAVED + 1, save=str(root), load=str(root))) == 0
    assert not stale.exists()


# -- files missing from or added to a checkpoint ----------------------------------------------------------

def _flip_a_bit(root: Path) -> None:
    shard = next(checkpoint_dir(root, SAVED).glob("*.distcp"))
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 1
    shard.write_bytes(bytes(data))


@pytest.mark.timeout(RUN_TIMEOUT_S)
@pytest.mark.parametrize("command", ["train", "convert-checkpoint"])
@pytest.mark.parametrize("flipped", [True, False], ids=["flipped", "intact"])
def test_a_deleted_manifest_is_refused_unless_no_verify(command, flipped, saved_run, tiny_prefix, cache_dir,
                                                        tmp_path, capsys):
    root = _copy(saved_run, tmp_path)
    (checkpoint_dir(root, SAVED) / MANIFEST_FILE).unlink()
    if flipped:
        _flip_a_bit(root)
    before = tree_digest(root)
    if command == "train":
        argv, main = run_argv(tiny_prefix, cache_dir, train_iters=SAVED + 1, save=str(root), load=str(root)), train_main
    else:
        argv, main = ["--from", str(root), "--to-hf", str(tmp_path / "hf")], convert_main
    line = _failed(main(argv), capsys.readouterr().err)
    assert str(checkpoint_dir(root, SAVED) / MANIFEST_FILE) in line and "--no-verify" in line, line
    assert tree_digest(root) == before
    assert main([*argv, "--no-verify"]) == 0


@pytest.mark.timeout(RUN_TIMEOUT_S)
def test_a_checkpoint_from_before_manifests_still_loads(data_test, tmp_path, caplog):
    root = tmp_path / "gpt"
    shutil.copytree(data_test / "checkpoints_before_redesign" / "gpt", root)
    (checkpoint_dir(root, SAVED) / MANIFEST_FILE).unlink()  # as written before manifests existed
    assert convert_main(["--from", str(root), "--to-hf", str(tmp_path / "hf")]) == 0
    assert f"has no {MANIFEST_FILE}" in caplog.text


@pytest.mark.timeout(RUN_TIMEOUT_S)
@pytest.mark.parametrize("command", ["train", "convert-checkpoint"])
def test_an_unknown_file_in_a_checkpoint_is_named_in_a_warning(command, saved_run, tiny_prefix, cache_dir, tmp_path,
                                                               caplog):
    root = _copy(saved_run, tmp_path)
    extra = checkpoint_dir(root, SAVED) / "notes.txt"
    extra.write_text("not part of the checkpoint\n")
    if command == "train":
        code = train_main(run_argv(tiny_prefix, cache_dir, train_iters=SAVED + 1, save=str(root), load=str(root)))
    else:
        code = convert_main(["--from", str(root), "--to-hf", str(tmp_path / "hf")])
    assert code == 0
    assert any(str(extra) in record.getMessage() and record.levelname == "WARNING" for record in caplog.records)
