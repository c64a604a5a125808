"""Marking runs done, and fanning one preprocessing job out over N processes (machines), resumably.

Every run is marked done by `{prefix}_done/{name}.done` (`name` is the last component of the run's
prefix), removed just before its outputs are published and written after every one of them is in
place (see `outputs.py`): a set of outputs is complete exactly when its marker exists. The marker
holds a fingerprint of what the outputs depend on (the settings that change the output bytes, the
tokenizer, and the input files with their sizes and modification times), so rerunning the same
command skips a finished run and redoes an unfinished one, after removing the leftovers of a killed
process (its hidden staging directory and temporaries). Markers live in a folder so that
`merge-datasets --input DIR` (ours and Megatron's, which skip folders) see only the datasets.

Rank R of N takes the R-th contiguous block of the sorted input files and writes
`{prefix}_part{R}-of-{N}_{key}_{level}` outputs (R zero-padded to the width of N), marked done by
`{prefix}_done/{name}_part{R}-of-{N}.done`. Merging the parts in rank order (`merge-datasets --input
DIR`, whose lexicographic order is the rank order) gives the bytes a single process writes over all
the files: documents keep the sorted file order. An unfinished part's outputs are removed before it is
redone, and a part marker whose fingerprint differs is an error unless `overwrite` is set: the part
was made by another command, and mixing parts of two commands would be silently wrong. A
single-process run made by another command is simply redone (as Megatron overwrites its outputs),
and its previous outputs stay in place until the new ones replace them.
"""

from __future__ import annotations

import dataclasses
import glob
import hashlib
import json
import logging
import os
import shutil
from collections.abc import Mapping, Sequence

from indexed_dataset import TokenmillError

from .config import PreprocessConfig
from .outputs import output_files, remove_output, staging_glob

logger = logging.getLogger(__name__)

DONE_SUFFIX = ".done"
DONE_FOLDER_SUFFIX = "_done"
# Settings that change how fast a part is made, not what it holds: left out of the fingerprint.
_RUNTIME_FIELDS = ("workers", "partitions", "log_interval", "chunk_bytes", "max_line_mb", "overwrite")
# Where launchers put the rank and the number of processes: torchrun first, then srun. Slurm's count is
# taken from SLURM_STEP_NUM_TASKS, which srun sets for the tasks of a step: a batch script itself also
# sees SLURM_NTASKS (and SLURM_PROCID=0) while it is one process, and must not take 1/N of the files.
RANK_VARIABLES = (("RANK", "WORLD_SIZE"), ("SLURM_PROCID", "SLURM_STEP_NUM_TASKS"))


def rank_from_environment(environ: Mapping[str, str] | None = None) -> tuple[int, int]:
    """(rank, world size) from `RANK`/`WORLD_SIZE` (torchrun), else `SLURM_PROCID`/`SLURM_STEP_NUM_TASKS`
    (srun; equal to its SLURM_NTASKS), else (0, 1)."""
    environ = os.environ if environ is None else environ
    for rank, world_size in RANK_VARIABLES:
        if rank in environ and world_size in environ:
            return int(environ[rank]), int(environ[world_size])
    return 0, 1


def rank_files(paths: Sequence[str], rank: int, world_size: int) -> list[str]:
    """The contiguous block of `paths` rank `rank` of `world_size` takes (sizes differ by at most one)."""
    count = len(paths)
    return list(paths[rank * count // world_size : (rank + 1) * count // world_size])


def done_marker_path(config: PreprocessConfig) -> str:
    """`{output_prefix}_done/{basename of the part prefix}.done`."""
    return os.path.join(config.output_prefix + DONE_FOLDER_SUFFIX, os.path.basename(config.part_prefix) + DONE_SUFFIX)


def part_fingerprint(config: PreprocessConfig, paths: Sequence[str]) -> str:
    """sha256 hex of the settings that shape the part's bytes and of its input files (path, size, mtime)."""
    settings = {field.name: getattr(config, field.name) for field in dataclasses.fields(config)
                if field.name not in _RUNTIME_FIELDS}
    settings["tokenizer"] = dataclasses.asdict(config.tokenizer)
    files = []
    for path in paths:
        status = os.stat(path)
        files.append([os.path.abspath(path), status.st_size, status.st_mtime_ns])
    text = json.dumps({"settings": settings, "files": files}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def part_is_done(config: PreprocessConfig, fingerprint: str) -> bool:
    """Whether this run (or part) is marked done by the same command and its outputs are all there.

    Raises:
        TokenmillError: fanned out, the part's marker was written by a different command (and
            `overwrite` is off).
    """
    marker = done_marker_path(config)
    if config.overwrite or not os.path.exists(marker):
        return False
    with open(marker, encoding="utf-8") as f:
        recorded = f.read().strip()
    if recorded != fingerprint:
        if config.world_size == 1:
            logger.info("%s: the outputs were made with other settings or inputs; redoing them", marker)
            return False
        raise TokenmillError(f"{marker}: this part was made with other settings or inputs; rerun with "
                             "--overwrite to redo it")
    missing = [path for key in config.json_keys for fmt, output in config.output_paths_of(key).items()
               for path in output_files(fmt, output, config.mindrecord_shards) if not os.path.exists(path)]
    if missing:
        logger.info("%s: marked done but %s is missing; redoing", marker, missing[0])
        return False
    return True


def remove_marker(config: PreprocessConfig) -> None:
    """Remove the run's done marker (its outputs are about to change)."""
    marker = done_marker_path(config)
    if os.path.exists(marker):
        os.remove(marker)


def clear_part(config: PreprocessConfig) -> None:
    """Remove what killed runs of this prefix left: staging directories and temporaries; fanned out,
    also the part's marker and outputs (a single process keeps its previous outputs, and their marker,
    until new ones replace them)."""
    for staging in glob.glob(staging_glob(config.part_prefix)):
        shutil.rmtree(staging, ignore_errors=True)
    if config.world_size > 1:
        remove_marker(config)
    for key in config.json_keys:
        if config.world_size > 1:
            for fmt, path in config.output_paths_of(key).items():
                remove_output(fmt, path, config.mindrecord_shards)
        stem = config.output_prefix_of(key)
        directory, name = os.path.split(os.path.abspath(stem))
        for temporary in glob.glob(os.path.join(glob.escape(directory), f".{glob.escape(name)}*.tmp")):
            if os.path.isfile(temporary):
                os.remove(temporary)


def mark_done(config: PreprocessConfig, fingerprint: str) -> None:
    """Write the done marker (through a temporary name: a marker is whole or absent)."""
    marker = done_marker_path(config)
    os.makedirs(os.path.dirname(marker), exist_ok=True)
    temporary = marker + ".tmp"
    with open(temporary, "w", encoding="utf-8") as f:
        f.write(fingerprint + "\n")
    os.replace(temporary, marker)
