"""A directory of `.npy` index arrays keyed by a hash of everything that determines them.

    cache = IndexCache("data/index-cache")
    arrays = cache.load_or_build("x_text_document-train", description, ("sample_index",), build)

Files of one entry (`H` = the first 32 hex digits of the SHA-256 of the canonical JSON description):
`{name}-{H}-{array}.npy` for each array, then `{name}-{H}.done`, the description itself, written last.
Every file is written under a unique temporary name and moved into place with `os.replace`, so a
reader never sees a partial file, and a `.done` marker means every array was in place before it.

There is no rank-0 build and no barrier: any process that finds no marker builds the arrays itself.
The build is deterministic, so when several processes (on one node or on several, shared file
system or not) build at once, each replaces identical bytes and every process ends with the same
valid arrays. Arrays are loaded with `mmap_mode="r"`, so all processes of a node share one copy.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import uuid
from typing import Callable, Mapping, Optional

import numpy as np

from indexed_dataset.machine import format_gib, free_disk_bytes

logger = logging.getLogger(__name__)

HASH_HEX_DIGITS = 32
"""128 bits of SHA-256: collisions are out of reach and file names stay readable."""


def description_hash(description: Mapping[str, object]) -> str:
    """Hex digest of the canonical JSON of a description (sorted keys, no whitespace)."""
    canonical = json.dumps(description, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:HASH_HEX_DIGITS]


def write_atomically(path: str, write: Callable[[object], None]) -> None:
    """Write `path` through `write(file)` under a unique temporary name, then rename it into place."""
    temporary = f"{path}.tmp-{uuid.uuid4().hex}"
    try:
        with open(temporary, "wb") as f:
            write(f)
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.remove(temporary)


def save_array(path: str, array: np.ndarray) -> None:
    """`numpy.save` without pickle, atomically."""
    write_atomically(path, lambda f: np.save(f, array, allow_pickle=False))


def _load_array(path: str) -> np.ndarray:
    """An `.npy` file memory-mapped read-only (numpy cannot map a zero-byte payload: read those)."""
    array = np.load(path, mmap_mode="r", allow_pickle=False)
    return array if array.size else np.array(array)


class IndexCache:
    """Index arrays stored in one directory (created on first write).

    Args:
        directory: where the files live; None keeps everything in memory (nothing is written).
    """

    def __init__(self, directory: Optional[str]) -> None:
        self.directory = directory

    def paths(self, name: str, description: Mapping[str, object], kinds: tuple[str, ...]) -> dict[str, str]:
        """File path of each array kind, and of the `.done` marker under the key "done"."""
        stem = os.path.join(self.directory or "", f"{name}-{description_hash(description)}")
        return {**{kind: f"{stem}-{kind}.npy" for kind in kinds}, "done": f"{stem}.done"}

    def load(self, name: str, description: Mapping[str, object], kinds: tuple[str, ...]) -> Optional[dict[str, np.ndarray]]:
        """The cached arrays, or None when the entry is absent, incomplete or unreadable."""
        if self.directory is None:
            return None
        paths = self.paths(name, description, kinds)
        if not os.path.exists(paths["done"]):
            return None
        try:
            return {kind: _load_array(paths[kind]) for kind in kinds}
        except (OSError, ValueError) as error:
            logger.warning("index cache entry %s is damaged (%s); rebuilding it", paths["done"], error)
            return None

    def save(self, name: str, description: Mapping[str, object], arrays: Mapping[str, np.ndarray]) -> bool:
        """Store the arrays, then the marker. Returns False (and logs why) if the directory is not writable."""
        paths = self.paths(name, description, tuple(arrays))
        needed = sum(array.nbytes for array in arrays.values())
        free = free_disk_bytes(self.directory)
        if needed > free:
            # Writing would fill the disk (for every other program too) before failing.
            logger.warning("the index cache in %s would need %s but the disk has %s free; keeping the indices in "
                           "memory", self.directory, format_gib(needed), format_gib(free))
            return False
        try:
            os.makedirs(self.directory, exist_ok=True)
            for kind, array in arrays.items():
                save_array(paths[kind], array)
            text = json.dumps(description, sort_keys=True, indent=1).encode("utf-8")
            write_atomically(paths["done"], lambda f: f.write(text))
        except OSError as error:
            logger.warning("cannot write the index cache in %s (%s); keeping the indices in memory", self.directory, error)
            return False
        return True

    def load_or_build(
        self,
        name: str,
        description: Mapping[str, object],
        kinds: tuple[str, ...],
        build: Callable[[], dict[str, np.ndarray]],
    ) -> dict[str, np.ndarray]:
        """The cached arrays if present, else `build()`'s, saved for next time and returned memory-mapped.

        Args:
            name: readable file name stem, e.g. "x_text_document-train".
            description: JSON-serialisable dict of everything that changes the arrays.
            kinds: the names of the arrays, e.g. ("document_index", "sample_index").
            build: computes the arrays (a dict with exactly `kinds` as keys); called only on a miss.
        """
        cached = self.load(name, description, kinds)
        if cached is not None:
            return cached
        arrays = build()
        if self.directory is None or not self.save(name, description, arrays):
            return arrays
        return self.load(name, description, kinds) or arrays
