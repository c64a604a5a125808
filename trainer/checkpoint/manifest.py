"""``manifest.json``: the size and SHA-256 of every file of a checkpoint directory, written at save and
checked at load, so that a damaged file is an error naming it, not a silently different model.

Layout::

    {"algorithm": "sha256", "block_bytes": 67108864,
     "files": {"__0_0.distcp": {"bytes": 1460000000, "sha256": ["<hex of block 0>", "<hex of block 1>", ...]},
               ".metadata": {...}}}

Each file is hashed in blocks of ``block_bytes`` so that the blocks of one large shard are hashed in
parallel: by several threads (hashlib releases the GIL on large updates) and, in a distributed save or
load, shared out over the ranks. The manifest guards against damage, not forgery (a forger rewrites it
too): the restricted unpickler of `trainer.checkpoint.store` is what keeps a crafted checkpoint from running code.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import torch.distributed as dist

from indexed_dataset.checksums import ALGORITHM, BLOCK_BYTES, block_digests, file_blocks
from indexed_dataset.path_rules import file_inside
from indexed_dataset.structured_files import read_json_file
from trainer.errors import CheckpointError

logger = logging.getLogger(__name__)

MANIFEST_FILE = "manifest.json"
# Written into every checkpoint directory before its manifest (and so listed in it): says that the directory
# was saved with a manifest, so that a lost manifest is an error, while a checkpoint from before manifests
# existed (which has neither file) still loads, unverified, with a warning.
MANIFESTED_FILE = "tokenmill_checkpoint.json"
MANIFEST_ALGORITHM = ALGORITHM
# Files are hashed in blocks of BLOCK_BYTES, read in pieces of READ_BYTES (memory stays flat), up to
# MAX_HASH_THREADS blocks at once per process: the block hashing is the datasets' (`indexed_dataset.checksums`),
# one implementation for both manifests; the names are re-exported here.
TEMP_SUFFIX = ".tmp"

Block = tuple[str, int]
"""(file name, block index)."""


def _rank_and_world(group: dist.ProcessGroup | None = None) -> tuple[int, int]:
    if dist.is_initialized() and dist.get_world_size(group) > 1:
        return dist.get_rank(group), dist.get_world_size(group)
    return 0, 1


def _digests(directory: Path, blocks: list[Block], block_bytes: int, shared: bool,
             group: dist.ProcessGroup | None = None) -> dict[Block, str]:
    """Digests of ``blocks``, hashed by this process's threads; with ``shared`` (collective over ``group``, default
    the world, when distributed) this rank hashes every world-th block and every rank then receives all of them."""
    rank, world = _rank_and_world(group) if shared else (0, 1)
    digests = block_digests(directory, blocks[rank::world], block_bytes)
    if world > 1:
        gathered: list[dict[Block, str] | None] = [None] * world
        dist.all_gather_object(gathered, digests, group=group)
        digests = {block: digest for part in gathered for block, digest in part.items()}
    return digests


def write_manifest(directory: Path, is_writer: bool = True, group: dist.ProcessGroup | None = None) -> None:
    """Hash every file of ``directory`` and write ``manifest.json`` (collective over ``group``, default the world,
    when distributed: every rank hashes a share; ``is_writer`` says which rank writes the file)."""
    sizes = {p.name: p.stat().st_size for p in directory.iterdir() if p.is_file() and p.name != MANIFEST_FILE}
    digests = _digests(directory, file_blocks(sizes, BLOCK_BYTES), BLOCK_BYTES, shared=True, group=group)
    if not is_writer:
        return
    files = {name: {"bytes": size, MANIFEST_ALGORITHM: [digests[block] for block in file_blocks({name: size}, BLOCK_BYTES)]}
             for name, size in sorted(sizes.items())}
    temp = directory / (MANIFEST_FILE + TEMP_SUFFIX)
    temp.write_text(json.dumps({"algorithm": MANIFEST_ALGORITHM, "block_bytes": BLOCK_BYTES, "files": files},
                               indent=1) + "\n")
    os.replace(temp, directory / MANIFEST_FILE)


def mark_manifested(directory: Path) -> None:
    """Write `MANIFESTED_FILE` into a checkpoint directory (before `write_manifest`; one rank)."""
    (directory / MANIFESTED_FILE).write_text(json.dumps({"manifest": MANIFEST_FILE}) + "\n", encoding="utf-8")


def has_listed_sizes(directory: Path, files: dict[str, dict]) -> bool:
    """True when every file of a manifest's ``files`` is in ``directory`` at its listed size (no hashing)."""
    try:
        return all((directory / name).stat().st_size == entry["bytes"] for name, entry in files.items())
    except OSError:
        return False


def read_manifest(directory: Path) -> tuple[dict[str, dict], int] | None:
    """The manifest's files (``{name: {"bytes": n, "sha256": [hex per block]}}``) and its block size, or None
    for a checkpoint saved without one.

    Raises:
        CheckpointError: the manifest is damaged, or names a file outside ``directory``.
    """
    path = directory / MANIFEST_FILE
    try:
        manifest = read_json_file(path, error=CheckpointError)
    except FileNotFoundError:
        return None
    except OSError as error:
        raise CheckpointError(f"{path}: unreadable manifest ({error})") from None
    files = manifest.get("files") if isinstance(manifest, dict) else None
    block_bytes = manifest.get("block_bytes") if isinstance(manifest, dict) else None
    if (manifest.get("algorithm") != MANIFEST_ALGORITHM or not isinstance(files, dict)
            or not isinstance(block_bytes, int) or block_bytes <= 0
            or not all(_is_entry(entry, block_bytes) for entry in files.values())):
        raise CheckpointError(f"{path}: not a tokenmill checkpoint manifest")
    for name in files:
        file_inside(directory, name, path, entry=f"files[{name!r}]", error=CheckpointError)
    return files, block_bytes


def _is_entry(entry: object, block_bytes: int) -> bool:
    if not isinstance(entry, dict) or not isinstance(entry.get("bytes"), int) or entry["bytes"] < 0:
        return False
    digests = entry.get(MANIFEST_ALGORITHM)
    return (isinstance(digests, list) and all(isinstance(d, str) for d in digests)
            and len(digests) == max(1, -(-entry["bytes"] // block_bytes)))


def verify_files(directory: Path, names: list[str] | None = None, shared: bool = False) -> None:
    """Check files of a checkpoint directory against its manifest (all of them when ``names`` is None).

    A checkpoint without a manifest (saved before manifests existed) is not checked (a warning says so).
    With ``shared`` (collective when distributed), the ranks hash a share of the blocks each.

    Raises:
        CheckpointError: a file is missing, has another size, or other bytes than at save; the manifest
            itself is missing from a checkpoint saved with one.
    """
    manifest = read_manifest(directory)
    if manifest is None and (directory / MANIFESTED_FILE).exists():
        raise CheckpointError(f"{directory / MANIFEST_FILE}: missing, but {directory / MANIFESTED_FILE} says the "
                              "checkpoint was saved with one, so its files cannot be verified; pass --no-verify "
                              "to load it anyway")
    if manifest is None:
        logger.warning("%s has no %s (saved by an older tokenmill): its files are not verified", directory,
                       MANIFEST_FILE)
        return
    files, block_bytes = manifest
    names = sorted(files) if names is None else names
    for name in names:
        path, entry = directory / name, files.get(name)
        if entry is None:
            raise CheckpointError(f"{path}: not listed in {directory / MANIFEST_FILE}")
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            raise CheckpointError(f"{path}: missing (listed in {MANIFEST_FILE})") from None
        if size != entry["bytes"]:
            raise CheckpointError(f"{path}: {size} bytes, but {entry['bytes']} were saved (truncated or replaced)")
    sizes = {name: files[name]["bytes"] for name in names}
    blocks = file_blocks(sizes, block_bytes)
    digests = _digests(directory, blocks, block_bytes, shared)
    for name, index in blocks:
        if digests[(name, index)] != files[name][MANIFEST_ALGORITHM][index]:
            raise CheckpointError(f"{directory / name}: damaged (bytes {index * block_bytes}.."
                                  f"{min((index + 1) * block_bytes, sizes[name])} differ from what was saved, "
                                  f"{MANIFEST_FILE}); pass --no-verify to load it anyway")
