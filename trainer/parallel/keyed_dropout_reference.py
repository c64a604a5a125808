"""Plain-numpy twin of `trainer.parallel.keyed_dropout`'s hash: the oracle of its tests.

Written independently of the torch code: 32-bit words are ``np.uint32`` arrays, whose products wrap
modulo 2**32 by definition (the torch code keeps int64 products' low words with a mask), and the
coordinates of an element are spelt out with ``np.indices`` instead of combined on broadcast views.

    keys = combine_reference(sample_keys_reference(seed, sample_ids), layer)    # uint32 [batch]
    assert (hashes_reference(keys, site, shape, offsets) == element_hashes(...).numpy()).all()
"""

from __future__ import annotations

import numpy as np

from trainer.parallel.keyed_dropout import COORDINATE_SALT, MIX_MULTIPLIERS


def mix32_reference(x: np.ndarray) -> np.ndarray:
    """lowbias32 of uint32 words (any shape) -> uint32 words."""
    x = np.asarray(x, dtype=np.uint32)
    with np.errstate(over="ignore"):
        x = x ^ (x >> np.uint32(16))
        x = x * np.uint32(MIX_MULTIPLIERS[0])
        x = x ^ (x >> np.uint32(15))
        x = x * np.uint32(MIX_MULTIPLIERS[1])
        return x ^ (x >> np.uint32(16))


def combine_reference(key: np.ndarray, coordinate: np.ndarray) -> np.ndarray:
    """mix32(key ^ mix32(coordinate + salt)) on uint32 words (coordinate taken modulo 2**32)."""
    with np.errstate(over="ignore"):
        salted = np.asarray(coordinate, dtype=np.uint64).astype(np.uint32) + np.uint32(COORDINATE_SALT)
    return mix32_reference(np.asarray(key, dtype=np.uint32) ^ mix32_reference(salted))


def sample_keys_reference(seed: int, sample_ids: np.ndarray) -> np.ndarray:
    """uint32 [batch]: each sample's key (seed and id each hashed low 32-bit word first)."""
    ids = np.asarray(sample_ids, dtype=np.uint64)
    key = np.zeros(ids.shape, dtype=np.uint32)
    for word in (seed & 0xFFFFFFFF, seed >> 32):
        key = combine_reference(key, np.full(ids.shape, word, dtype=np.uint64))
    for word in (ids & np.uint64(0xFFFFFFFF), ids >> np.uint64(32)):
        key = combine_reference(key, word)
    return key


def hashes_reference(layer_keys: np.ndarray, site: int, shape: tuple[int, ...],
                     offsets: tuple[int, ...]) -> np.ndarray:
    """uint32 ``shape``: the hash of every element, key by key, site, then each dim's global index.

    Args:
        layer_keys: [shape[0]] keys of the samples at one layer.
        site: the dropout site.
        shape: the local tensor's shape, samples first.
        offsets: global index of the first local element along each dim after the first.
    """
    index = np.indices(shape)
    h = combine_reference(np.asarray(layer_keys, dtype=np.uint32)[index[0]], np.full(shape, site, dtype=np.uint64))
    for dim in range(1, len(shape)):
        h = combine_reference(h, index[dim] + offsets[dim - 1])
    return h
