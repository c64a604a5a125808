"""The fused q/k/v projection (``train --fused-qkv``, OneFlow's ``--multihead-attention-fusion``): its row
layout, and the conversion to and from the separate q, k and v tensors that checkpoints hold.

A fused block holds one ``attention.wqkv`` linear, weight [3h, h] and bias [3h], where the unfused one
holds ``wq``, ``wk`` and ``wv`` ([h, h] and [h] each). Its output rows are laid out per head, as
Megatron's ``linear_qkv``::

    rows = [heads, 3, head_dim]: head 0's q rows, k rows, v rows, then head 1's q, k, v, ...

so column-parallel sharding of dim 0 (`ColwiseParallel`, Shard(0)) gives each tensor-parallel rank the
q, k and v rows of its own heads. (A [q; k; v] stack sharded on dim 0 would give rank 0 of 2 all of q
and half of k.) The layout does not depend on the tp degree, so checkpoints reshard freely.

Checkpoints always hold the unfused names (``model.layers.0.attention.wq.weight``,
``optim.layers.0.attention.wq.weight.exp_avg``): a run with or without fusion resumes from either,
and ``convert-checkpoint``, ``generate`` and the HF mapping (GPT-2's ``c_attn`` is a [q | k | v]
column stack, not per head) see one layout. `to_checkpoint` splits a run's state on save,
`from_checkpoint` fuses the loaded tensors back.

    fused = fuse_qkv(q, k, v, num_heads=12)          # [3h, ...] from three [h, ...]
    q, k, v = split_qkv(fused, num_heads=12)
"""

from __future__ import annotations

import torch
from torch.distributed.tensor import DTensor, distribute_tensor

from trainer.checkpoint.store import copy_into_parameter

# q, k and v: the projections one fused linear holds.
QKV = 3
PARTS = ("wq", "wk", "wv")
# The fused linear's name inside a block, and the suffixes `GPT.init_parameter` recognises.
FUSED_NAME = "attention.wqkv."
FUSED_WEIGHT = FUSED_NAME + "weight"


def fuse_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Three projections -> the fused per-head layout.

    Args:
        q, k, v: [h, ...] each (a weight [h, h], a bias [h], or their optimiser moments).
        num_heads: attention heads (h = num_heads x head_dim).

    Returns:
        [3h, ...], rows [heads, 3, head_dim] (a new contiguous tensor).
    """
    rows = q.shape[0]
    stacked = torch.stack([t.reshape(num_heads, rows // num_heads, *t.shape[1:]) for t in (q, k, v)], dim=1)
    return stacked.reshape(QKV * rows, *q.shape[1:])


def split_qkv(fused: torch.Tensor, num_heads: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The inverse of `fuse_qkv`: [3h, ...] in the per-head layout -> (q, k, v), [h, ...] each (contiguous)."""
    rows = fused.shape[0] // QKV
    per_head = fused.reshape(num_heads, QKV, rows // num_heads, *fused.shape[1:])
    return tuple(per_head[:, index].reshape(rows, *fused.shape[1:]).contiguous() for index in range(QKV))


def unfused_name(name: str, part: str) -> str:
    """``...attention.wqkv.<rest>`` -> ``...attention.<part>.<rest>`` (``part`` one of `PARTS`)."""
    return name.replace(FUSED_NAME, f"attention.{part}.")


def is_fused_name(name: str) -> bool:
    return FUSED_NAME in name


def fuse_state(state: dict[str, torch.Tensor], num_heads: int) -> dict[str, torch.Tensor]:
    """Full (unsharded) tensors under unfused names -> the same under fused names (other entries kept).

    ``state`` maps names such as ``layers.0.attention.wq.weight`` (any prefix or suffix) to tensors;
    each wq/wk/wv triple becomes one ``wqkv`` entry.
    """
    fused: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        if f"attention.{PARTS[0]}." in name:
            target = name.replace(f"attention.{PARTS[0]}.", FUSED_NAME)
            fused[target] = fuse_qkv(*(state[unfused_name(target, part)] for part in PARTS), num_heads=num_heads)
        elif not any(f"attention.{part}." in name for part in PARTS[1:]):
            fused[name] = tensor
    return fused


def _split_entry(tensor: torch.Tensor, num_heads: int) -> tuple[torch.Tensor, ...]:
    """One fused state tensor -> its q, k, v tensors, sharded as ``tensor`` (a 0-d AdamW step is shared)."""
    if tensor.dim() == 0:
        return tuple(tensor.clone() for _ in range(QKV))
    if not isinstance(tensor, DTensor):
        return split_qkv(tensor.detach(), num_heads)
    # Under FSDP2 a rank's rows need not be whole heads: regroup from the full tensor, one at a time.
    parts = split_qkv(tensor.full_tensor(), num_heads)
    return tuple(distribute_tensor(part, tensor.device_mesh, tensor.placements, src_data_rank=None) for part in parts)


def to_checkpoint(state: dict[str, torch.Tensor], num_heads: int) -> dict[str, torch.Tensor]:
    """A run's checkpoint state (``model.<param>``, ``optim.<param>.<key>``, ...) under unfused names.

    Each entry of a fused parameter becomes three new tensors, sharded like it (DTensors: the same
    mesh and placements); every other entry is passed through, the same tensor object. Collective
    when the fused entries are DTensors (every rank of their mesh calls it, in the same order).
    """
    out: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        if not is_fused_name(name):
            out[name] = tensor
            continue
        for part, piece in zip(PARTS, _split_entry(tensor, num_heads)):
            out[unfused_name(name, part)] = piece
    return out


@torch.no_grad()
def from_checkpoint(loaded: dict[str, torch.Tensor], state: dict[str, torch.Tensor], num_heads: int) -> None:
    """Copy the unfused entries of ``loaded`` (``to_checkpoint(state)``, then filled by a checkpoint
    load) back into the fused tensors of ``state``, in place. Collective like `to_checkpoint`."""
    for name, tensor in state.items():
        if not is_fused_name(name):
            continue
        pieces = [loaded[unfused_name(name, part)] for part in PARTS]
        if tensor.dim() == 0:
            tensor.copy_(pieces[0])
            continue
        full = [p.full_tensor() if isinstance(p, DTensor) else p for p in pieces]
        copy_into_parameter(tensor, fuse_qkv(*full, num_heads=num_heads))
