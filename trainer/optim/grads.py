"""Gradient bookkeeping that PyTorch leaves to the trainer: a DTensor- and pipeline-aware global norm,
clipping, tied-embedding gradient sync across pipeline stages, and loss reduction for logging."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import NamedTuple

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor, Partial, Replicate


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def _sum_of_squares(grads: list[torch.Tensor], device: torch.device) -> torch.Tensor:
    """Sum of squares of the elements of ``grads`` (float64 scalar on ``device``).

    One multi-tensor norm kernel per (device, dtype) computes each tensor's norm in float32 (as Megatron
    does; bf16/fp16 gradients are upcast inside the kernel, never copied), and the per-tensor norms are
    combined in float64. float64 accumulation inside the kernel cost 4-5x more on CPU for a relative
    difference of ~1e-8.
    """
    by_kind: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = defaultdict(list)
    for grad in grads:
        by_kind[(grad.device, grad.dtype)].append(grad)
    total = torch.zeros((), dtype=torch.float64, device=device)
    for tensors in by_kind.values():
        norms = torch._foreach_norm(tensors, 2.0, dtype=torch.float32)
        total += torch.stack(norms).to(device, torch.float64).square().sum()
    return total


def _reduced_over_shards(local_squares: torch.Tensor, grad: DTensor) -> torch.Tensor:
    """Add a group's local sum of squares over the mesh dimensions its gradients are sharded on."""
    # Any non-replicated placement is a shard here (partial sums were reduced before); FSDP2 over TP
    # shards with `_StridedShard`, which is not a `Shard`.
    placements = [Replicate() if placement.is_replicate() else Partial() for placement in grad.placements]
    return DTensor.from_local(local_squares, grad.device_mesh, placements, run_check=False).full_tensor()


class GradNorm(NamedTuple):
    """`global_grad_norm`'s figures: scalar tensors on the gradients' device, queued (reading one is the caller's
    wait for the device)."""

    total: torch.Tensor
    """The L2 norm of all gradients of the whole model, identical on every rank (float64)."""
    local_finite: torch.Tensor
    """Whether this rank's own parts of the gradients have finite norms (bool): false where one holds a NaN or an
    infinity, or where its float32 norm overflows (the rank that makes the total infinite)."""


@torch.no_grad()  # DTensor's `to_local` is an autograd function: with grad mode on each call sets up its backward
def global_grad_norm(params: list[nn.Parameter], pp_group: dist.ProcessGroup | None) -> GradNorm:
    """The L2 norm of all gradients of the whole model, identical on every rank, and whether this rank's own part
    of it is finite (computing them queues kernels and collectives; nothing is read).

    ``params`` must hold each model parameter once per pipeline stage (leave out the last stage's
    copy of the tied embedding). DTensor gradients are grouped by mesh and placements so each group
    costs one reduction over its sharded mesh dimensions (FSDP2's ``dp`` shards; an expert weight's
    (expert_dp, ep) shards at ZeRO stages 2-3, or its ``ep`` shards below, never its replicas over tp);
    plain gradients are identical on their tp/dp peers and need none; the sums of squares of the stages
    are added over ``pp_group``.
    """
    device = params[0].device if params else torch.device("cpu")
    groups: dict[object, list[DTensor]] = defaultdict(list)
    plain: list[torch.Tensor] = []
    for p in params:
        grad = p.grad  # no graph hangs on a gradient (no double backward here): no `detach`, a DTensor dispatch
        if grad is None:
            continue
        if isinstance(grad, DTensor):
            if any(placement.is_partial() for placement in grad.placements):
                # A pending sum is not a sum of squares: reduce it first (rare; gradients are
                # normally sharded or replicated by the time the optimiser sees them).
                grad = grad.redistribute(grad.device_mesh, [Replicate() if placement.is_partial() else placement
                                                            for placement in grad.placements])
            groups[(grad.device_mesh, grad.placements)].append(grad)
        else:
            plain.append(grad)
    total = _sum_of_squares(plain, device)
    local = total.clone()
    for grads in groups.values():
        squares = _sum_of_squares([g.to_local() for g in grads], device)
        local += squares
        total += _reduced_over_shards(squares, grads[0])
    if pp_group is not None:
        dist.all_reduce(total, group=pp_group)
    return GradNorm(total.sqrt(), local.isfinite())


def _local_grads(params: Iterable[nn.Parameter]) -> list[torch.Tensor]:
    """This rank's own part of every gradient (a DTensor's local tensor)."""
    return [_local(p.grad) for p in params if p.grad is not None]


@torch.no_grad()
def scale_grads(params: list[nn.Parameter], factor: float | torch.Tensor) -> None:
    """Multiply every gradient by ``factor`` in place (clipping and loss-scale division), on this rank's own part
    of it (exact for any DTensor placement), with torch's multi-tensor kernels: a few launches rather than one per
    parameter. ``factor`` may be a scalar tensor on the gradients' device (`clip_factor`'s), which the kernels
    read there: nothing waits for the device."""
    if isinstance(factor, float) and factor == 1.0:
        return
    if isinstance(factor, torch.Tensor):
        # CUDA's multi-tensor kernel takes a scalar tensor of the gradients' dtype (another dtype falls back to
        # one launch per tensor); float32, as the kernels round a Python scalar factor.
        factor = factor.to(torch.float32)
    grads = _local_grads(params)
    if grads:
        torch._foreach_mul_(grads, factor)


@torch.no_grad()
def divide_grads(params: Iterable[nn.Parameter], divisor: int) -> None:
    """Divide every gradient by ``divisor`` in place, on this rank's own part of it: exact for any DTensor
    placement (a pending sum divides term by term), where DTensor's own in-place division of a pending sum is
    refused by torch 2.10 (what a pipeline schedule's ``scale_grads`` does)."""
    if divisor == 1:
        return
    grads = _local_grads(params)
    if grads:
        torch._foreach_div_(grads, divisor)


def clip_factor(total_norm: torch.Tensor, max_norm: float) -> torch.Tensor:
    """Megatron's clip coefficient: ``max_norm / (norm + 1e-6)`` capped at 1; 1 when clipping is off, and where
    the norm is not finite (the gradients stay as they are: that step is skipped, or the run stops naming the
    ranks whose gradients hold the value). A scalar tensor beside ``total_norm`` (its dtype), computed there."""
    if max_norm <= 0:
        return torch.ones_like(total_norm)
    return torch.where(total_norm.isfinite(), (max_norm / (total_norm + 1.0e-6)).clamp(max=1.0), 1.0)


def sync_tied_embedding_grad(param: nn.Parameter | None, group: dist.ProcessGroup | None) -> None:
    """Sum the tied embedding's gradient between the first and last pipeline stage."""
    if group is None or param is None or param.grad is None:
        return
    if isinstance(param.grad, DTensor) and param.grad.placements != param.placements:
        # The vocab-parallel embedding's backward returns a Replicate gradient for its Shard(0)
        # weight; the head's copy gets Shard(0). Both sides must send the same local shard.
        param.grad = param.grad.redistribute(param.device_mesh, param.placements)
    dist.all_reduce(_local(param.grad), group=group)


def mean_loss(local_loss_sum: torch.Tensor, holds_loss: bool, num_losses: int, num_holders: int) -> torch.Tensor:
    """Mean training loss over the global batch, identical on every rank (float64 scalar on the loss's device;
    queued, not read).

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
    return value / (num_holders * num_losses)


def reduce_loss(local_loss_sum: torch.Tensor, holds_loss: bool, num_losses: int, num_holders: int) -> float:
    """`mean_loss`, read on the host."""
    return float(mean_loss(local_loss_sum, holds_loss, num_losses, num_holders))


def queue_host_read(values: torch.Tensor) -> Callable[[], list[float]]:
    """Start copying ``values`` (a small 1-D tensor) to the host; the returned function waits for that copy only
    and gives its floats. On CUDA the copy goes into pinned memory behind the kernels queued so far, so work
    queued after this call (the optimizer's step) keeps the device busy while the host waits and reads."""
    if values.device.type != "cuda":
        return values.tolist
    host = torch.empty(values.shape, dtype=values.dtype, pin_memory=True)
    host.copy_(values, non_blocking=True)
    copied = torch.cuda.Event()
    copied.record()

    def read() -> list[float]:
        copied.synchronize()
        return host.tolist()

    return read


def ranks_where(condition: bool, rank: int) -> list[int]:
    """The ranks on which ``condition`` holds. Collective (one all-gather of a bool): every rank calls it, so
    call it only where every rank takes the same branch."""
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return [rank] if condition else []
    flags: list[bool | None] = [None] * dist.get_world_size()
    dist.all_gather_object(flags, condition)
    return [index for index, flag in enumerate(flags) if flag]
