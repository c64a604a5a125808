"""The trainer's manifests may only name files inside their own folder (issue 26, "paths that lead outside").

* A Hugging Face directory's `model.safetensors.index.json` mapping a tensor to `../../outside`, an
  absolute path, a shard that is a symbolic link leading out, or something that is not a name:
  `convert-checkpoint --from-hf` (and `read_hf_weights`, which train/generate --load-hf use) refuse in
  one line naming the index and the tensor, with a non-zero exit and no traceback; the file outside (a
  valid safetensors shard, which would load if followed) is never opened from Python and nothing in the
  tree changes. A Hugging Face cache snapshot, whose files are links into the cached model's `blobs/`,
  still loads.
* A checkpoint's `manifest.json` naming `../x` or an absolute path is refused naming the manifest.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys

import pytest
import safetensors.torch
from hf_testing import make_tiny_hf

from trainer.cli import convert as convert_cli
from trainer.checkpoint.manifest import MANIFEST_FILE, verify_files
from trainer.errors import CheckpointError, HFConversionError
from trainer.checkpoint.hf_files import read_hf_weights

pytestmark = pytest.mark.timeout(180)

INDEX = "model.safetensors.index.json"
SHARDS = ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")
_OPENED: list[str] = []


def _audit(event: str, args: tuple) -> None:
    if event == "open" and args and isinstance(args[0], (str, bytes, os.PathLike)):
        _OPENED.append(os.fsdecode(args[0]))


sys.addaudithook(_audit)


def _tree(root) -> dict[str, str]:
    """Relative path -> sha256 of the bytes (files) or the target (links), links not followed."""
    entries = {}
    for directory, folders, files in os.walk(root):
        for name in folders + files:
            path = os.path.join(directory, name)
            if os.path.islink(path):
                entries[os.path.relpath(path, root)] = "link " + os.readlink(path)
            elif os.path.isfile(path):
                with open(path, "rb") as f:
                    entries[os.path.relpath(path, root)] = hashlib.sha256(f.read()).hexdigest()
    return entries


@pytest.fixture(scope="module")
def tiny_hf(tmp_path_factory):
    return make_tiny_hf(tmp_path_factory.mktemp("hf") / "gpt2")


def _sharded(tiny_hf, root) -> tuple[str, dict[str, str]]:
    """A copy of the tiny model with its tensors in two shards named by an index; the second shard is
    moved to `root/outside/` (the sentinel). Returns (model directory, weight map)."""
    model = root / "models" / "gpt2"
    shutil.copytree(tiny_hf, model)
    tensors = safetensors.torch.load_file(model / "model.safetensors")
    os.remove(model / "model.safetensors")
    names = sorted(tensors)
    halves = (names[: len(names) // 2], names[len(names) // 2:])
    (root / "outside").mkdir()
    for shard, half, folder in zip(SHARDS, halves, (model, root / "outside")):
        safetensors.torch.save_file({name: tensors[name] for name in half}, folder / shard, metadata={"format": "pt"})
    weight_map = {name: shard for shard, half in zip(SHARDS, halves) for name in half}
    return str(model), weight_map


def _write_index(model: str, weight_map: dict) -> None:
    with open(os.path.join(model, INDEX), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f)


@pytest.mark.parametrize("case", ["dotdot", "absolute", "link", "not a name"])
@pytest.mark.parametrize("reader", ["convert-checkpoint", "read_hf_weights"])
def test_a_shard_index_may_not_lead_outside(tiny_hf, tmp_path, capfd, reader, case):
    model, weight_map = _sharded(tiny_hf, tmp_path)
    sentinel = str(tmp_path / "outside" / SHARDS[1])
    moved = [name for name, shard in weight_map.items() if shard == SHARDS[1]]
    if case == "link":
        os.symlink(sentinel, os.path.join(model, SHARDS[1]))
    else:
        value = {"dotdot": os.path.relpath(sentinel, model), "absolute": sentinel, "not a name": 5}[case]
        weight_map.update({name: value for name in moved})
    _write_index(model, weight_map)
    before = _tree(tmp_path)
    _OPENED.clear()
    if reader == "read_hf_weights":
        with pytest.raises(HFConversionError) as raised:
            read_hf_weights(model)
        message = str(raised.value)
    else:
        capfd.readouterr()
        assert convert_cli.main(["--from-hf", model, "--to", str(tmp_path / "checkpoint")]) != 0
        error = capfd.readouterr().err
        assert "Traceback" not in error and len(error.strip().splitlines()) == 1, error
        message = error
    opened = list(_OPENED)
    assert os.path.join(model, INDEX) in message and "weight_map[" in message
    assert not [path for path in opened if os.path.realpath(path) == os.path.realpath(sentinel)]
    assert _tree(tmp_path) == before


def test_a_hub_cache_snapshot_of_links_into_blobs_still_loads(tiny_hf, tmp_path):
    model, weight_map = _sharded(tiny_hf, tmp_path)
    shutil.move(str(tmp_path / "outside" / SHARDS[1]), os.path.join(model, SHARDS[1]))
    _write_index(model, weight_map)
    cached = tmp_path / "hub" / "models--tiny--gpt2"
    (cached / "blobs").mkdir(parents=True)
    snapshot = cached / "snapshots" / "0123abcd"
    snapshot.mkdir(parents=True)
    for name in os.listdir(model):
        blob = cached / "blobs" / hashlib.sha256(name.encode()).hexdigest()
        shutil.copyfile(os.path.join(model, name), blob)
        os.symlink(os.path.relpath(blob, snapshot), snapshot / name)
    assert sorted(read_hf_weights(snapshot)) == sorted(weight_map)


@pytest.mark.parametrize("case", ["dotdot", "absolute"])
def test_a_checkpoint_manifest_may_not_lead_outside(tmp_path, case):
    checkpoint = tmp_path / "iter_0000001"
    checkpoint.mkdir()
    sentinel = tmp_path / "outside.bin"
    sentinel.write_bytes(b"not part of the checkpoint")
    name = "../outside.bin" if case == "dotdot" else str(sentinel)
    entry = {"bytes": sentinel.stat().st_size, "sha256": [hashlib.sha256(sentinel.read_bytes()).hexdigest()]}
    manifest = {"algorithm": "sha256", "block_bytes": 64 << 20, "files": {name: entry}}
    (checkpoint / MANIFEST_FILE).write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match="manifest.json: files"):
        verify_files(checkpoint)
