"""SHA-256 manifests: the size and block digests of files we wrote, checked when we read them back, so that a
damaged file (a flipped bit in an Arrow data buffer or a MindRecord blob, formats without checksums of their
own) is an error naming it, not different token ids passed on silently.

    write_dataset_checksums("arrow", "out/corpus_arrow")       # after the writer published it
    verify_dataset_checksums("arrow", "out/corpus_arrow", files_read("arrow", reader))

A dataset's manifest sits beside it, named after its path (`dataset_checksum_path`):

    out/corpus_text_document.sha256sums   (mmap: the .bin and .idx)
    out/corpus_arrow.sha256sums           (an Arrow folder: its shards and JSON files)
    out/corpus.mindrecord.sha256sums      (MindRecord: every data file and its .db)

Layout (JSON; names relative to the manifest's folder)::

    {"algorithm": "sha256", "block_bytes": 67108864,
     "files": {"corpus_arrow/data-00000-of-00001.arrow": {"bytes": 1460000000, "sha256": ["<hex>", ...]}, ...}}

Each file is hashed in blocks of `block_bytes`, several blocks at once on threads (hashlib releases the GIL
on large updates); the checkpoint manifest (`trainer.checkpoint.manifest`) hashes the same way. A dataset
without a manifest (written by another tool, or by an older tokenmill) is read unverified. The manifest
guards against damage, not forgery.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor

from .errors import IndexFormatError, ShardFormatError

logger = logging.getLogger(__name__)

ALGORITHM = "sha256"
CHECKSUM_SUFFIX = ".sha256sums"
# Files are hashed in blocks of this many bytes, read in pieces of READ_BYTES (memory stays flat), up to
# MAX_HASH_THREADS blocks at once.
BLOCK_BYTES = 64 << 20
READ_BYTES = 8 << 20
MAX_HASH_THREADS = 8
_TEMP_SUFFIX = ".tmp"
_SHARD_NUMBER = re.compile(r"(?<=\.mindrecord)\d+$")

Block = tuple[str, int]
"""(file name relative to a folder, block index)."""


def block_digest(directory: str | os.PathLike, block: Block, block_bytes: int) -> str:
    """The hex SHA-256 of one block of the file `block[0]` of `directory`."""
    name, index = block
    digest = hashlib.new(ALGORITHM)
    with open(os.path.join(directory, name), "rb") as f:
        f.seek(index * block_bytes)
        left = block_bytes
        while left > 0 and (piece := f.read(min(READ_BYTES, left))):
            digest.update(piece)
            left -= len(piece)
    return digest.hexdigest()


def file_blocks(sizes: dict[str, int], block_bytes: int) -> list[Block]:
    """Every block of files of these sizes (an empty file has one, empty, block)."""
    return [(name, index) for name, size in sorted(sizes.items()) for index in range(max(1, -(-size // block_bytes)))]


def block_digests(directory: str | os.PathLike, blocks: list[Block], block_bytes: int) -> dict[Block, str]:
    """The digest of every block, hashed on up to MAX_HASH_THREADS threads."""
    threads = max(1, min(len(blocks), os.cpu_count() or 1, MAX_HASH_THREADS))
    with ThreadPoolExecutor(max_workers=threads) as pool:
        return dict(zip(blocks, pool.map(lambda block: block_digest(directory, block, block_bytes), blocks)))


def dataset_checksum_path(path: str | os.PathLike) -> str:
    """Where the manifest of the dataset at `path` (mmap prefix, Arrow folder or file, MindRecord file) is."""
    return os.fspath(path).rstrip(os.sep) + CHECKSUM_SUFFIX


def _expanded(files: Iterable[str]) -> list[str]:
    """`files`, with each folder (an Arrow dataset) replaced by the files in it."""
    expanded = []
    for file in files:
        if os.path.isdir(file):
            expanded += sorted(os.path.join(file, name) for name in os.listdir(file)
                               if os.path.isfile(os.path.join(file, name)))
        else:
            expanded.append(file)
    return expanded


def remove_dataset_checksums(path: str | os.PathLike) -> None:
    """Remove the manifest of the dataset at `path`, if it has one (before the dataset is rewritten or
    removed: a manifest of the old files must never describe new ones). Anything else at the manifest's
    name (a folder) is left; writing the new manifest then fails naming it."""
    manifest = dataset_checksum_path(path)
    if os.path.isfile(manifest) or os.path.islink(manifest):
        os.remove(manifest)


def write_dataset_checksums(path: str | os.PathLike, files: Iterable[str]) -> str:
    """Hash `files` (a folder: every file in it) and write the manifest of the dataset at `path`; returns
    the manifest's path. Written under a temporary name, then renamed."""
    manifest = dataset_checksum_path(path)
    folder = os.path.dirname(os.path.abspath(manifest))
    sizes = {os.path.relpath(os.path.abspath(file), folder): os.path.getsize(file) for file in _expanded(files)}
    digests = block_digests(folder, file_blocks(sizes, BLOCK_BYTES), BLOCK_BYTES)
    entries = {name: {"bytes": size, ALGORITHM: [digests[block] for block in file_blocks({name: size}, BLOCK_BYTES)]}
               for name, size in sorted(sizes.items())}
    temp = manifest + _TEMP_SUFFIX
    with open(temp, "w", encoding="utf-8") as f:
        json.dump({"algorithm": ALGORITHM, "block_bytes": BLOCK_BYTES, "files": entries}, f, indent=1)
        f.write("\n")
    os.replace(temp, manifest)
    return manifest


def _read_manifest(manifest: str, error: type[Exception]) -> tuple[dict[str, dict], int] | None:
    """The manifest's files and block size, or None when there is no manifest."""
    try:
        with open(manifest, encoding="utf-8") as f:
            content = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, RecursionError) as problem:
        raise error(f"{manifest}: unreadable checksum manifest ({problem})") from None
    files = content.get("files") if isinstance(content, dict) else None
    block_bytes = content.get("block_bytes") if isinstance(content, dict) else None
    if (not isinstance(content, dict) or content.get("algorithm") != ALGORITHM or not isinstance(files, dict)
            or type(block_bytes) is not int or block_bytes <= 0
            or not all(_is_entry(entry, block_bytes) for entry in files.values())):
        raise error(f"{manifest}: not a tokenmill checksum manifest")
    return files, block_bytes


def _is_entry(entry: object, block_bytes: int) -> bool:
    if not isinstance(entry, dict) or type(entry.get("bytes")) is not int or entry["bytes"] < 0:
        return False
    digests = entry.get(ALGORITHM)
    return (isinstance(digests, list) and all(isinstance(d, str) for d in digests)
            and len(digests) == max(1, -(-entry["bytes"] // block_bytes)))


def verify_dataset_checksums(fmt: str, path: str | os.PathLike, files: Iterable[str]) -> bool:
    """Check the files of the dataset at `path` that a reader reads (`formats.files_read`) against the
    dataset's manifest; returns False when it has none (nothing to check).

    Raises:
        IndexFormatError (mmap) / ShardFormatError (Arrow, MindRecord): a file read is not in the manifest,
            has another size, or other bytes than when it was written; one line naming the file.
    """
    error = IndexFormatError if fmt == "mmap" else ShardFormatError
    manifest_path = dataset_checksum_path(path)
    if fmt == "mindrecord" and not os.path.lexists(manifest_path):
        # A multi-shard MindRecord may be named by any shard (`x.mindrecord2`); its manifest is `x.mindrecord`'s.
        manifest_path = dataset_checksum_path(_SHARD_NUMBER.sub("", os.fspath(path)))
    manifest = _read_manifest(manifest_path, error)
    if manifest is None:
        return False
    entries, block_bytes = manifest
    folder = os.path.dirname(os.path.abspath(manifest_path))
    sizes = {}
    for file in files:
        name = os.path.relpath(os.path.abspath(file), folder)
        entry = entries.get(name)
        if entry is None:
            raise error(f"{file}: not listed in {manifest_path} (added after the dataset was written)")
        size = os.path.getsize(file)
        if size != entry["bytes"]:
            raise error(f"{file}: {size} bytes, but {entry['bytes']} were written ({manifest_path}): truncated "
                        "or replaced; pass --no-verify to read it anyway")
        sizes[name] = size
    blocks = file_blocks(sizes, block_bytes)
    digests = block_digests(folder, blocks, block_bytes)
    for name, index in blocks:
        if digests[(name, index)] != entries[name][ALGORITHM][index]:
            raise error(f"{os.path.join(folder, name)}: damaged (bytes {index * block_bytes}.."
                        f"{min((index + 1) * block_bytes, sizes[name])} differ from {manifest_path}); pass "
                        "--no-verify to read it anyway")
    logger.debug("%s: %d files match %s", path, len(sizes), manifest_path)
    return True
