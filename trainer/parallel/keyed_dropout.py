"""Dropout masks keyed by where they apply, so that every parallel layout draws the same ones.

With ``--keyed-dropout`` a mask element is not the next draw of a random stream (which differs between
tensor, pipeline and data-parallel layouts: each rank draws for its own shard, stages and ranks have
their own streams) but a pure function of its global coordinates:

    (run seed, the sample's id in the run's global sample order, global layer, dropout site,
     the element's index along every other dim of the full, unsharded tensor: position, head, feature)

hashed to 32 uniform bits by successive rounds of a 32-bit integer mixer (`mix32`: Wellons' lowbias32,
computed in int64 with the product masked to 32 bits, so the same ops give the same bits on any
device). The element is kept when its bits are at or above ``round(p * 2**32)`` (probability 1 - p,
exact to 2**-32) and scaled by 1 / (1 - p), as `torch.nn.functional.dropout` does.

The sample id already orders the run's steps (a step reads the next global batch of ids), so the
iteration needs no coordinate of its own, and a resumed run continues with the same masks. Coordinates
are combined on broadcast tensors, one dim at a time: only the last round is as large as the tensor.

    keys = sample_keys(seed, micro_batch.sample_ids)        # int64 [batch], once per micro-batch
    block_keys = layer_keys(keys, layer=3)                  # the model's forward, per block
    dropout = KeyedDropout(0.1, sequence_dim=1)             # a site module, as nn.Dropout
    h = dropout(h, block_keys, site=2)                      # [batch, seq, hidden]; keys None: nn.Dropout

A sharded tensor knows its place in the full one from `set_tensor_parallel` (the runner calls it once):
a site declares which of its dims tensor parallelism shards (attention heads, MLP features) and which
sequence parallelism shards (the residual stream); this rank's slice starts at ``tp_rank * local size``.
Attention probabilities cannot be masked inside ``F.scaled_dot_product_attention``: `attention`
computes them explicitly when a keyed mask applies (the flag's speed cost). The numpy twin of the
hash is `trainer.parallel.keyed_dropout_reference`.
"""

from __future__ import annotations

from typing import TypeVar

import torch
import torch.nn.functional as F
from torch import nn

MASK32 = 0xFFFFFFFF
# lowbias32's multipliers (Chris Wellons' hash-prospector; bias 0.17 of an ideal mixer's).
MIX_MULTIPLIERS = (0x7FEB352D, 0x846CA68B)
# Added to a coordinate before mixing it: mix32(0) is 0, and coordinate 0 should not leave a key unchanged.
COORDINATE_SALT = 0x9E3779B9
# The layer coordinate of the sites outside the blocks (embeddings, final norms): no block has this index.
OUTSIDE_LAYERS = MASK32
# The keep threshold's scale: the hash gives 32 uniform bits.
HASH_RANGE = 1 << 32

Int = TypeVar("Int", int, torch.Tensor)


def mix32(x: Int) -> Int:
    """lowbias32 of ``x`` (ints in [0, 2**32), a Python int or an int64 tensor): a bijection of 32-bit words.

    The int64 products of two 32-bit words may wrap past 2**63; their low 32 bits, all that is kept, are
    exact either way (two's complement), on CPU and CUDA alike.
    """
    x = x ^ (x >> 16)
    x = (x * MIX_MULTIPLIERS[0]) & MASK32
    x = x ^ (x >> 15)
    x = (x * MIX_MULTIPLIERS[1]) & MASK32
    return x ^ (x >> 16)


def combine(key: Int, coordinate: Int) -> Int:
    """The key of ``coordinate`` (in [0, 2**32)) under ``key``: mix32(key ^ mix32(coordinate + salt))."""
    return mix32(key ^ mix32((coordinate + COORDINATE_SALT) & MASK32))


def _combine_wide(key: Int, value: Int) -> Int:
    """`combine` with a value of up to 64 bits: its low word, then its high word."""
    return combine(combine(key, value & MASK32), (value >> 32) & MASK32)


def sample_keys(seed: int, sample_ids: torch.Tensor) -> torch.Tensor:
    """int64 [batch] in [0, 2**32): the key of each sample of a micro-batch in a run seeded ``seed``.

    Args:
        seed: the run's seed (a non-negative int of up to 64 bits).
        sample_ids: int64 [batch], each sample's id in the run's global sample order.
    """
    return _combine_wide(_combine_wide(0, seed), sample_ids.long())


def layer_keys(keys: torch.Tensor | None, layer: int) -> torch.Tensor | None:
    """The keys of global layer ``layer`` (or OUTSIDE_LAYERS) from `sample_keys`; None stays None."""
    return None if keys is None else combine(keys, layer)


def element_hashes(keys: torch.Tensor, site: int, shape: tuple[int, ...], offsets: tuple[int, ...]) -> torch.Tensor:
    """int64 ``shape`` in [0, 2**32): the hash of every element of a site's (local) tensor.

    Args:
        keys: int64 [shape[0]], `layer_keys` of the micro-batch's samples.
        site: which dropout of the layer (a family's constant).
        shape: the local tensor's shape, samples first.
        offsets: per dim after the first, the global index of this rank's first element along it.
    """
    ndim = len(shape)
    h = combine(keys, site).view(-1, *([1] * (ndim - 1)))
    for dim in range(1, ndim):
        coordinate = torch.arange(offsets[dim - 1], offsets[dim - 1] + shape[dim], device=keys.device)
        h = combine(h, coordinate.view([shape[dim] if d == dim else 1 for d in range(ndim)]))
    return h


def drop_threshold(p: float) -> int:
    """Hashes below this are dropped: round(p * 2**32), so an element is kept with probability 1 - p."""
    return round(p * HASH_RANGE)


def keep_mask(keys: torch.Tensor, site: int, shape: tuple[int, ...], offsets: tuple[int, ...],
              p: float) -> torch.Tensor:
    """bool ``shape``: the elements a keyed dropout of probability ``p`` keeps (see `element_hashes`)."""
    return element_hashes(keys, site, shape, offsets) >= drop_threshold(p)


class KeyedDropout(nn.Dropout):
    """``nn.Dropout`` that, given keys, applies the keyed mask of its site instead of a random one.

    Args:
        p: drop probability.
        tensor_parallel_dim: the dim tensor parallelism shards in this site's tensors (attention heads,
            MLP features), or None.
        sequence_dim: the dim sequence parallelism shards (the residual stream's sequence), or None.
    """

    def __init__(self, p: float, tensor_parallel_dim: int | None = None, sequence_dim: int | None = None) -> None:
        super().__init__(p)
        self.tensor_parallel_dim = tensor_parallel_dim
        self.sequence_dim = sequence_dim
        self.tp_rank = 0
        """This rank's tensor-parallel index (`set_tensor_parallel`)."""
        self.sequence_parallel = False

    def applies(self, keys: torch.Tensor | None) -> bool:
        """Whether a forward with ``keys`` draws a keyed mask (training, p > 0, keys given)."""
        return keys is not None and self.training and self.p > 0

    def offsets(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """Global index of this rank's first element along each dim after the first (shards are equal)."""
        sharded = {self.tensor_parallel_dim}
        if self.sequence_parallel:
            sharded.add(self.sequence_dim)
        sharded = {d % len(shape) for d in sharded if d is not None}
        return tuple(self.tp_rank * shape[d] if d in sharded else 0 for d in range(1, len(shape)))

    def forward(self, x: torch.Tensor, keys: torch.Tensor | None = None, site: int = 0) -> torch.Tensor:
        """x: [batch, ...] -> x with the site's mask applied (keys: int64 [batch] from `layer_keys`).

        Without keys (or in eval mode) exactly ``nn.Dropout``: the same random draws as before the flag.
        """
        if not self.applies(keys):
            return F.dropout(x, self.p, self.training, self.inplace)
        if self.p == 1.0:
            return torch.zeros_like(x)
        keep = keep_mask(keys, site, tuple(x.shape), self.offsets(tuple(x.shape)), self.p)
        return x * keep * (1.0 / (1.0 - self.p))


def set_tensor_parallel(module: nn.Module, tp_rank: int, sequence_parallel: bool) -> None:
    """Tell every `KeyedDropout` of ``module`` where its shards start: tensor-parallel rank ``tp_rank``,
    with the residual stream sharded along the sequence if ``sequence_parallel``."""
    for child in module.modules():
        if isinstance(child, KeyedDropout):
            child.tp_rank = tp_rank
            child.sequence_parallel = sequence_parallel


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None, is_causal: bool,
              scale: float | None, dropout: KeyedDropout, keys: torch.Tensor | None, site: int) -> torch.Tensor:
    """``F.scaled_dot_product_attention`` with its probabilities passed through ``dropout``'s site mask.

    The fused kernel when no keyed mask applies (the same call as without keyed dropout); otherwise
    softmax(q k^T scale + mask) in float32, the keyed mask over [batch, heads, queries, keys], times v.

    Args:
        q, k, v: [batch, local heads, seq, head_dim] (keys/values may be longer than the queries).
        attn_mask: additive float mask broadcastable to the scores, or None.
        is_causal: mask keys after each query (queries and keys aligned at the end).
        scale: score scale; None is 1/sqrt(head_dim).
    """
    if not dropout.applies(keys):
        p = dropout.p if dropout.training else 0.0
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=p, is_causal=is_causal,
                                              scale=scale)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    scores = torch.matmul(q, k.transpose(-2, -1)) * scale
    if attn_mask is not None:
        scores = scores + attn_mask
    if is_causal:
        queries, length = q.shape[-2], k.shape[-2]
        visible = torch.ones(queries, length, dtype=torch.bool, device=q.device).tril(length - queries)
        scores = scores.masked_fill(~visible, float("-inf"))
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(v.dtype)
    return torch.matmul(dropout(probs, keys, site), v)
