"""Shared pieces of the save-fault tests: a tiny run's command line, a saved run to copy, directory hashes."""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path

from trainer_testing import argv_for, tiny_config

from trainer.checkpoint.save_directory import LOCK_FILE

SAVED_ITERATIONS = 2


def run_argv(prefix: str, cache: str, *, train_iters: int = SAVED_ITERATIONS, save: str | None = None,
             load: str | None = None, save_interval: int | None = None) -> list[str]:
    """``train`` flags of the tiny 2-layer run, its metrics beside ``--save`` (the default)."""
    config = tiny_config(prefix, cache, train_iters=train_iters, save=save, load=load, save_interval=save_interval,
                         num_layers=2)
    config = dataclasses.replace(config, logging=dataclasses.replace(config.logging, metrics_file=None))
    return [*argv_for(config), "--log-interval", "1"]


def tree_digest(root: Path, ignore: tuple[str, ...] = (LOCK_FILE,)) -> dict[str, str]:
    """Relative path -> SHA-256 of every file under ``root`` (symlinks as their target text), but ``ignore``."""
    digests = {}
    for path in sorted(root.rglob("*")):
        if path.name in ignore:
            continue
        if path.is_symlink():
            digests[str(path.relative_to(root))] = "-> " + str(path.readlink())
        elif path.is_file():
            digests[str(path.relative_to(root))] = hashlib.sha256(path.read_bytes()).hexdigest()
        else:
            digests[str(path.relative_to(root)) + "/"] = "dir"
    return digests


def error_lines(stderr: str) -> list[str]:
    """The lines of ``stderr`` that are not log lines of the run (the command's own error lines)."""
    return [line for line in stderr.splitlines() if line.startswith(("train: ", "finetune: ", "convert-checkpoint: "))]
