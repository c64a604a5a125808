"""A crafted checkpoint never runs code, and a damaged one is never loaded as if sound.

The attacks are the pickle tricks that reach a callable (dotted names through an allowed module,
STACK_GLOBAL, INST, OBJ, ``__reduce_ex__``, copyreg's reconstructor and extension registry, nested
getattr, builtins, torch.load gadgets, persistent ids), written into a real checkpoint's ``.metadata``
with its manifest rewritten to match (a forger controls both). Each is run against the three commands
that read checkpoints: ``train --load``, ``generate --load`` and ``convert-checkpoint --from``. Each must
exit non-zero with one line naming the ``.metadata`` file, and its payload (creating a marker file)
must never run.

Damage (a flipped bit, a truncated, empty or missing shard file) is found by the manifest's checksums
before anything is read, as one line naming the file; ``--no-verify`` skips the check.
"""

from __future__ import annotations

import copyreg
import os
import pickle
import shutil
import struct
from pathlib import Path

import pytest
import torch
from hf_testing import make_tiny_hf
from trainer_testing import argv_for, tiny_config

from trainer.checkpoint.store import METADATA_FILE, checkpoint_dir
from trainer.checkpoint.manifest import MANIFEST_FILE, MANIFESTED_FILE, write_manifest
from trainer.cli.train import main as train_main
from trainer.errors import CheckpointError
from trainer.cli.convert import main as convert_main
from trainer.cli.generate import main as generate_main

ITERATION = 1
# A code the copyreg extension registry lends to the attack for the length of one test.
EXTENSION_CODE = 0xF0


def _text(value: str) -> bytes:
    """A protocol-0 STRING opcode pushing ``value``."""
    return b"S" + repr(value).encode() + b"\n"


def _short_unicode(value: str) -> bytes:
    """A SHORT_BINUNICODE opcode pushing ``value``."""
    data = value.encode()
    return b"\x8c" + bytes([len(data)]) + data


def _binbytes(data: bytes) -> bytes:
    """A BINBYTES opcode pushing ``data``."""
    return b"B" + struct.pack("<I", len(data)) + data


class _Evil:
    """Pickles as a call of os.system (what ``__reduce_ex__`` lets any object do)."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce_ex__(self, protocol):
        return os.system, (self.command,)


def _torch_saved_evil(command: str) -> bytes:
    path = Path(os.environ.get("TMPDIR", "/tmp")) / f"inner-{os.getpid()}.pt"
    torch.save({"x": _Evil(command)}, path)
    try:
        return path.read_bytes()
    finally:
        path.unlink()


def attacks(marker: Path) -> dict[str, bytes]:
    """Name -> ``.metadata`` bytes whose loading would create ``marker``."""
    cmd = f"touch {marker}"
    allowed = "torch.distributed.checkpoint.filesystem"
    return {
        "dotted name through an allowed module (GLOBAL)":
            b"c" + allowed.encode() + b"\nos.system\n(" + _text(cmd) + b"tR.",
        "dotted name through an allowed module (STACK_GLOBAL)":
            b"\x80\x04" + _short_unicode(allowed) + _short_unicode("os.system") + b"\x93" + _short_unicode(cmd)
            + b"\x85R.",
        "plain global os.system": b"cos\nsystem\n(" + _text(cmd) + b"tR.",
        "INST": b"(" + _text(cmd) + b"ios\nsystem\n.",
        "OBJ": b"(cos\nsystem\n" + _text(cmd) + b"o.",
        "__reduce_ex__": pickle.dumps(_Evil(cmd), protocol=2),
        "copyreg._reconstructor": b"ccopyreg\n_reconstructor\n(csubprocess\nPopen\ncbuiltins\nobject\n"
                                  + _text(cmd) + b"tR.",
        "copyreg extension code": b"\x80\x02(" + _text(cmd) + b"\x82" + bytes([EXTENSION_CODE]) + b"\x85R.",
        "nested getattr": b"cbuiltins\ngetattr\n(c" + allowed.encode() + b"\nos\n" + _text("system") + b"tR("
                          + _text(cmd) + b"tR.",
        "builtins.eval": b"cbuiltins\neval\n(" + _text(f"__import__('os').system({cmd!r})") + b"tR.",
        "builtins.exec": b"cbuiltins\nexec\n(" + _text(f"import os; os.system({cmd!r})") + b"tR.",
        "torch.load gadget (storage._load_from_bytes)":
            b"\x80\x03ctorch.storage\n_load_from_bytes\n(" + _binbytes(_torch_saved_evil(cmd)) + b"tR.",
        "torch._utils rebuild gadget": b"ctorch._utils\n_rebuild_tensor_v2\n(" + _text(cmd) + b"tR.",
        "another name of an allowed module": b"ctorch.serialization\nload\n(" + _text(str(marker)) + b"tR.",
        "a torch function posing as a dtype": b"ctorch\nload\n(" + _text(str(marker)) + b"tR.",
        "persistent id": b"P0\n.",
    }


ATTACK_NAMES = list(attacks(Path("marker")))


@pytest.fixture(scope="module")
def saved_run(tiny_prefix, cache_dir, tmp_path_factory) -> Path:
    """A real one-step train checkpoint (with model_config.json and a manifest)."""
    root = tmp_path_factory.mktemp("checkpoint_attacks") / "run"
    config = tiny_config(tiny_prefix, cache_dir, train_iters=ITERATION, save=str(root), num_layers=2)
    assert train_main(argv_for(config)) == 0
    return root


@pytest.fixture()
def extension_registered():
    """os.system under EXTENSION_CODE in copyreg's registry, as a process that registered it would have."""
    copyreg.add_extension("os", "system", EXTENSION_CODE)
    yield
    copyreg.remove_extension("os", "system", EXTENSION_CODE)


def _commands(root: Path, tiny_prefix: str, cache_dir: str, out: Path) -> dict[str, tuple]:
    train_argv = argv_for(tiny_config(tiny_prefix, cache_dir, train_iters=ITERATION + 1, load=str(root),
                                      num_layers=2))
    return {
        "train": (train_main, train_argv),
        "generate": (generate_main, ["--load", str(root), "--prompt-ids", "1 2 3", "--max-new-tokens", "2",
                                     "--greedy"]),
        "convert-checkpoint": (convert_main, ["--from", str(root), "--to-hf", str(out / "hf")]),
    }


def _fails_with_one_line(command: str, main, argv: list[str], capsys) -> str:
    assert main(argv) != 0, f"{command} loaded it"
    err = capsys.readouterr().err
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"{command}: error: "), err
    return last


@pytest.mark.usefixtures("extension_registered")
@pytest.mark.parametrize("attack", ATTACK_NAMES)
def test_a_crafted_metadata_never_runs_code(attack, saved_run, tiny_prefix, cache_dir, tmp_path, capsys):
    root = tmp_path / "run"
    shutil.copytree(saved_run, root)
    marker = tmp_path / "pwned"
    directory = checkpoint_dir(root, ITERATION)
    (directory / METADATA_FILE).write_bytes(attacks(marker)[attack])
    write_manifest(directory)  # the forger makes the manifest agree
    for command, (main, argv) in _commands(root, tiny_prefix, cache_dir, tmp_path).items():
        line = _fails_with_one_line(command, main, argv, capsys)
        assert str(directory / METADATA_FILE) in line, line
        assert not marker.exists(), f"{attack} ran its payload under {command}"


def test_the_unpickler_names_the_refused_global(saved_run, tmp_path, tiny_prefix, cache_dir, capsys):
    root = tmp_path / "run"
    shutil.copytree(saved_run, root)
    directory = checkpoint_dir(root, ITERATION)
    (directory / METADATA_FILE).write_bytes(attacks(tmp_path / "x")["dotted name through an allowed module (GLOBAL)"])
    write_manifest(directory)
    main, argv = _commands(root, tiny_prefix, cache_dir, tmp_path)["convert-checkpoint"]
    line = _fails_with_one_line("convert-checkpoint", main, argv, capsys)
    assert "refused global torch.distributed.checkpoint.filesystem.os.system" in line


def test_a_pytorch_model_bin_that_is_not_weights_only_is_refused(tmp_path, capsys):
    directory = make_tiny_hf(tmp_path / "hf")
    marker = tmp_path / "pwned"
    (directory / "model.safetensors").unlink()
    torch.save({"transformer.wte.weight": torch.zeros(2), "x": _Evil(f"touch {marker}")},
               directory / "pytorch_model.bin")
    for command, main, argv in (
            ("convert-checkpoint", convert_main, ["--from-hf", str(directory), "--to", str(tmp_path / "ckpt")]),
            ("generate", generate_main, ["--load", str(directory), "--prompt-ids", "1 2", "--greedy"])):
        line = _fails_with_one_line(command, main, argv, capsys)
        assert "pytorch_model.bin: refused, not a weights-only file (it refers to posix.system)" in line
        assert "weights_only=False" not in line
        assert not marker.exists()


# -- damage ----------------------------------------------------------------------------------------------

def _shard(directory: Path) -> Path:
    return next(p for p in sorted(directory.iterdir()) if p.suffix == ".distcp")


def _flip_a_bit(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x10
    path.write_bytes(bytes(data))


DAMAGES = {
    "a flipped bit": _flip_a_bit,
    "truncated": lambda p: p.write_bytes(p.read_bytes()[: p.stat().st_size // 2]),
    "empty": lambda p: p.write_bytes(b""),
    "missing": lambda p: p.unlink(),
}


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_a_damaged_shard_is_one_line_naming_it(damage, saved_run, tiny_prefix, cache_dir, tmp_path, capsys):
    root = tmp_path / "run"
    shutil.copytree(saved_run, root)
    shard = _shard(checkpoint_dir(root, ITERATION))
    DAMAGES[damage](shard)
    for command, (main, argv) in _commands(root, tiny_prefix, cache_dir, tmp_path).items():
        assert str(shard) in _fails_with_one_line(command, main, argv, capsys)


@pytest.mark.parametrize("damage", ["truncated", "empty", "missing"])
def test_without_verification_a_damaged_shard_is_still_one_line(damage, saved_run, tmp_path, capsys):
    root = tmp_path / "run"
    shutil.copytree(saved_run, root)
    directory = checkpoint_dir(root, ITERATION)
    DAMAGES[damage](_shard(directory))
    line = _fails_with_one_line("convert-checkpoint", convert_main,
                                ["--from", str(root), "--to-hf", str(tmp_path / "hf"), "--no-verify"], capsys)
    assert str(directory) in line


def test_no_verify_loads_a_flipped_bit_and_an_old_checkpoint_loads_unverified(saved_run, tmp_path, caplog):
    root = tmp_path / "run"
    shutil.copytree(saved_run, root)
    directory = checkpoint_dir(root, ITERATION)
    _flip_a_bit(_shard(directory))
    assert convert_main(["--from", str(root), "--to-hf", str(tmp_path / "flipped"), "--no-verify"]) == 0
    (directory / MANIFEST_FILE).unlink()  # what a checkpoint saved before manifests looks like: neither file
    (directory / MANIFESTED_FILE).unlink()
    assert convert_main(["--from", str(root), "--to-hf", str(tmp_path / "old")]) == 0
    assert f"has no {MANIFEST_FILE}" in caplog.text


def test_every_saved_file_is_in_the_manifest(saved_run):
    import json

    directory = checkpoint_dir(saved_run, ITERATION)
    listed = json.loads((directory / MANIFEST_FILE).read_text())["files"]
    assert sorted(listed) == sorted(p.name for p in directory.iterdir() if p.name != MANIFEST_FILE)
    assert all(entry["bytes"] == (directory / name).stat().st_size for name, entry in listed.items())


def test_a_damaged_block_of_a_large_file_is_found_and_named(tmp_path, monkeypatch):
    """Files are hashed in blocks (in parallel); a change in any block, the last partial one included, is
    one line naming the file and the byte range."""
    import trainer.checkpoint.manifest as manifest

    monkeypatch.setattr(manifest, "BLOCK_BYTES", 1000)
    (tmp_path / "shard").write_bytes(bytes(range(256)) * 10)  # 2,560 bytes: blocks of 1000, 1000, 560
    manifest.write_manifest(tmp_path)
    manifest.verify_files(tmp_path)
    for offset, block_range in ((10, "0..1000"), (1500, "1000..2000"), (2559, "2000..2560")):
        data = bytearray((tmp_path / "shard").read_bytes())
        data[offset] ^= 1
        (tmp_path / "shard").write_bytes(bytes(data))
        with pytest.raises(CheckpointError, match=f"shard: damaged \\(bytes {block_range} differ"):
            manifest.verify_files(tmp_path)
        data[offset] ^= 1
        (tmp_path / "shard").write_bytes(bytes(data))
