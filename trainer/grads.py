"""Gradient bookkeeping that PyTorch leaves to the trainer: a DTensor- and pipeline-aware global norm,
clipping, tied-embedding gradient sync across pipeline stages, and loss reduction for logging."""

from __future__ import annotations

from collections import defaultdict

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def global_grad_norm(params: list[nn.Parameter], pp_group: dist.ProcessGroup | None) -> torch.Tensor:
    """The L2 norm of all gradients of the whole model, identical on every rank (float64 scalar).

    ``params`` must hold each model parameter once per pipeline stage (leave out the last stage's
    copy of the tied embedding). DTensor gradients are grouped by mesh and placements so each group
    costs one reduction; plain gradients are identical on their tp/dp peers and need none; the sums
    of squares of the stages are added over ``pp_group``.
    """
    groups: dict[object, list[torch.Tensor]] = defaultdict(list)
    plain: list[torch.Tensor] = []
    for p in params:
        if p.grad is None:
            continue
        grad = p.grad
        if isinstance(grad, DTensor):
            groups[(grad.device_mesh, grad.placements)].append(grad)
        else:
            plain.append(grad.detach())
    total = torch.zeros((), dtype=torch.float64)
    if plain:
        # One multi-tensor norm kernel for all plain gradients (this is most of the cost at degree 1).
        total += torch.nn.utils.get_total_norm(plain, norm_type=2.0).double().cpu() ** 2
    for grads in groups.values():
        squares = sum(g.detach().to(torch.float64).pow(2).sum() for g in grads)
        total += squares.full_tensor().cpu()
    if pp_group is not None:
        device = params[0].device if params else torch.device("cpu")
        total = total.to(device)
        dist.all_reduce(total, group=pp_group)
    return total.cpu().sqrt()


def scale_grads(params: list[nn.Parameter], factor: float) -> None:
    """Multiply every gradient by ``factor`` in place (clipping and loss-scale division)."""
    if factor == 1.0:
        return
    with torch.no_grad():
        for p in params:
            if p.grad is not None:
                p.grad.mul_(factor)


def clip_factor(total_norm: float, max_norm: float) -> float:
    """Megatron's clip coefficient: ``max_norm / (norm + 1e-6)`` capped at 1; 1 when clipping is off."""
    if max_norm <= 0:
        return 1.0
    return min(1.0, max_norm / (total_norm + 1.0e-6))


def sync_tied_embedding_grad(param: nn.Parameter | None, group: dist.ProcessGroup | None) -> None:
    """Sum the tied embedding's gradient between the first and last pipeline stage."""
    if group is None or param is None or param.grad is None:
        return
    if isinstance(param.grad, DTensor) and param.grad.placements != param.placements:
        # The vocab-parallel embedding's backward returns a Replicate gradient for its Shard(0)
        # weight; the head's copy gets Shard(0). Both sides must send the same local shard.
        param.grad = param.grad.redistribute(param.device_mesh, param.placements)
    dist.all_reduce(_local(param.grad), group=group)


def reduce_loss(local_loss_sum: torch.Tensor, holds_loss: bool, num_losses: int, num_holders: int) -> float:
    """Mean training loss over the global batch, identical on every rank.

    Args:
        local_loss_sum: sum of this rank's micro-batch losses (only read if ``holds_loss``).
        holds_loss: this rank computes losses (the last pipeline stage, or every rank without PP).
        num_losses: micro-batch losses each loss-holding rank contributes.
        num_holders: ranks that hold losses (dp x tp: the tp ranks of one dp rank hold equal sums).
    """
    value = local_loss_sum.detach().double() if holds_loss else torch.zeros((), dtype=torch.float64,
                                                                              device=local_loss_sum.device)
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(value)
    return float(value.cpu()) / (num_holders * num_losses)
