"""The fused q/k/v projection (``train --fused-qkv``, OneFlow's ``--multihead-attention-fusion``): its row
layout, and the conversion to and from the separate q, k and v tensors that checkpoints hold.

A fused block holds one ``attention.wqkv`` linear, weight [3h, h] and bias [3h], where the unfused one
holds ``wq``, ``wk`` and ``wv`` ([h, h] and [h] each). Its output rows are laid out per head, as
Megatron's ``linear_qkv``::

    rows = [heads, 3, head_dim]: head 0's q rows, k rows, v rows, then head 1's q, k, v, ...

so column-parallel sharding of dim 0 (`ColwiseParallel`, Shard(0)) gives each tensor-parallel rank the
q, k and v rows of its own heads. (A [q; k; v] stack sharded on dim 0 would give rank 0 of 2 all of q
and half of k.) The layout does not depend on the tp degree, so checkpoints reshard freely.

With grouped-query attention (G key/value groups of H/G query heads each) the rows are per group, again
as Megatron's ``linear_qkv``: ``[groups, H/G + 2, head_dim]``, a group's q heads, then its k, then its v
(multi-head attention, G = H, is the layout above), so a tensor-parallel rank holds whole groups.

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

from trainer.checkpoint.load import copy_into_parameter

# q, k and v: the projections one fused linear holds.
QKV = 3
PARTS = ("wq", "wk", "wv")
# The fused linear's name inside a block, and the suffixes `GPT.init_parameter` recognises.
FUSED_NAME = "attention.wqkv."
FUSED_WEIGHT = FUSED_NAME + "weight"


def fuse_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, num_heads: int,
             num_groups: int | None = None) -> torch.Tensor:
    """Three projections -> the fused per-group layout.

    Args:
        q: [H d, ...] (a weight [H d, h], a bias [H d], or their optimiser moments).
        k, v: [G d, ...] each.
        num_heads: query heads H.
        num_groups: key/value groups G (None: H, multi-head attention).

    Returns:
        [(H + 2 G) d, ...], rows [groups, H/G + 2, head_dim] (a new contiguous tensor).
    """
    groups = num_groups or num_heads
    per_group = [t.reshape(groups, t.shape[0] // groups, *t.shape[1:]) for t in (q, k, v)]
    return torch.cat(per_group, dim=1).reshape(-1, *q.shape[1:])


def split_qkv(fused: torch.Tensor, num_heads: int, num_groups: int | None = None
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The inverse of `fuse_qkv`: [(H + 2 G) d, ...] in the per-group layout -> (q [H d, ...], k, v [G d, ...]),
    contiguous."""
    groups = num_groups or num_heads
    head_dim = fused.shape[0] // (num_heads + 2 * groups)
    q_rows = num_heads // groups * head_dim
    per_group = fused.reshape(groups, -1, *fused.shape[1:])
    parts = per_group.split([q_rows, head_dim, head_dim], dim=1)
    return tuple(part.reshape(-1, *fused.shape[1:]).contiguous() for part in parts)


def unfused_name(name: str, part: str) -> str:
    """``...attention.wqkv.<rest>`` -> ``...attention.<part>.<rest>`` (``part`` one of `PARTS`)."""
    return name.replace(FUSED_NAME, f"attention.{part}.")


def is_fused_name(name: str) -> bool:
    return FUSED_NAME in name


def fuse_state(state: dict[str, torch.Tensor], num_heads: int, num_groups: int | None = None
               ) -> dict[str, torch.Tensor]:
    """Full (unsharded) tensors under unfused names -> the same under fused names (other entries kept).

    ``state`` maps names such as ``layers.0.attention.wq.weight`` (any prefix or suffix) to tensors;
    each wq/wk/wv triple becomes one ``wqkv`` entry.
    """
    fused: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        if f"attention.{PARTS[0]}." in name:
            target = name.replace(f"attention.{PARTS[0]}.", FUSED_NAME)
            fused[target] = fuse_qkv(*(state[unfused_name(target, part)] for part in PARTS), num_heads=num_heads,
                                     num_groups=num_groups)
        elif not any(f"attention.{part}." in name for part in PARTS[1:]):
            fused[name] = tensor
    return fused


def _split_entry(tensor: torch.Tensor, num_heads: int, num_groups: int | None) -> tuple[torch.Tensor, ...]:
    """One fused state tensor -> its q, k, v tensors, sharded as ``tensor`` (a 0-d AdamW step is shared)."""
    if tensor.dim() == 0:
        return tuple(tensor.clone() for _ in range(QKV))
    if not isinstance(tensor, DTensor):
        return split_qkv(tensor.detach(), num_heads, num_groups)
    # Under FSDP2 a rank's rows need not be whole heads: regroup from the full tensor, one at a time.
    parts = split_qkv(tensor.full_tensor(), num_heads, num_groups)
    return tuple(distribute_tensor(part, tensor.device_mesh, tensor.placements, src_data_rank=None) for part in parts)


def to_checkpoint(state: dict[str, torch.Tensor], num_heads: int, num_groups: int | None = None
                  ) -> dict[str, torch.Tensor]:
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
        for part, piece in zip(PARTS, _split_entry(tensor, num_heads, num_groups)):
            out[unfused_name(name, part)] = piece
    return out


@torch.no_grad()
def from_checkpoint(loaded: dict[str, torch.Tensor], state: dict[str, torch.Tensor], num_heads: int,
                    num_groups: int | None = None) -> None:
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
        copy_into_parameter(tensor, fuse_qkv(*full, num_heads=num_heads, num_groups=num_groups))
