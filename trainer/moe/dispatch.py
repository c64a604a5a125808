"""Token dispatch and combine: capacity dropping, sorting assignments by expert, and under expert
parallelism the ``all_to_all_single`` exchange with the ranks that hold the experts.

An assignment is one (token, chosen expert) pair; T tokens with top-k routing make T x k of them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed._functional_collectives import all_to_all_single, all_to_all_single_autograd, wait_tensor


def expert_capacity(num_tokens: int, top_k: int, num_experts: int, capacity_factor: float) -> int:
    """Assignments one expert takes from ``num_tokens`` tokens: ceil(factor x tokens x k / experts)."""
    return math.ceil(capacity_factor * num_tokens * top_k / num_experts)


def capacity_keep_mask(experts: torch.Tensor, num_experts: int, capacity: int, groups: int = 1) -> torch.Tensor:
    """bool [T, k]: which assignments of ``experts`` int64 [T, k] fit in the experts' capacity.

    The T tokens form ``groups`` equal consecutive groups (sequences, for a per-sequence capacity), each
    with its own ``capacity`` per expert. Priority within a group (GShard's): every token's first choice
    before any second choice, then token order; an expert keeps its first ``capacity`` assignments in that
    order. Deterministic, and the same for a token wherever its micro-batch (or sequence) runs.
    """
    top_k = experts.shape[1]
    by_priority = experts.view(groups, -1, top_k).transpose(1, 2).reshape(groups, -1)  # [G, k T/G]: slot 0 first
    one_hot = F.one_hot(by_priority, num_experts)
    position = (one_hot.cumsum(dim=1) * one_hot).sum(dim=2) - 1  # rank of the assignment at its expert
    return (position < capacity).view(groups, top_k, -1).transpose(1, 2).reshape(-1, top_k)


@dataclass(frozen=True, slots=True)
class Dispatch:
    """The kept assignments, sorted by expert (stable: token order within an expert)."""

    token_index: torch.Tensor
    """int64 [N]: the token of each assignment."""
    weights: torch.Tensor
    """float32 [N]: its gate."""
    counts: torch.Tensor
    """int64 [E]: kept assignments per expert (N in all)."""


def plan_dispatch(experts: torch.Tensor, weights: torch.Tensor, keep: torch.Tensor | None,
                  num_experts: int) -> Dispatch:
    """Sort the assignments ``experts``/``weights`` [T, k] (those ``keep`` marks, all if None) by expert."""
    num_tokens, top_k = experts.shape
    token_index = torch.arange(num_tokens, device=experts.device).repeat_interleave(top_k)
    flat_experts, flat_weights = experts.reshape(-1), weights.reshape(-1)
    if keep is not None:
        kept = keep.reshape(-1)
        token_index, flat_experts, flat_weights = token_index[kept], flat_experts[kept], flat_weights[kept]
    order = torch.argsort(flat_experts, stable=True)
    return Dispatch(token_index=token_index[order], weights=flat_weights[order],
                    counts=torch.bincount(flat_experts, minlength=num_experts))


def combine(expert_outputs: torch.Tensor, dispatch: Dispatch, num_tokens: int) -> torch.Tensor:
    """[T, hidden]: each token's gated sum of its experts' outputs (zero for a token whose every assignment
    was dropped: the block's residual carries it through)."""
    gated = expert_outputs * dispatch.weights.to(expert_outputs.dtype)[:, None]
    out = expert_outputs.new_zeros(num_tokens, expert_outputs.shape[1])
    return out.index_add(0, dispatch.token_index, gated)


@dataclass(frozen=True, slots=True)
class Exchange:
    """How tokens travelled to the expert-parallel ranks, to bring the outputs back."""

    send_splits: list[int]
    """Rows sent to each ep rank."""
    receive_splits: list[int]
    """Rows received from each ep rank."""
    order: torch.Tensor
    """int64 [M]: received rows regrouped by local expert (row i of the grouped input is received row order[i])."""


def send_to_experts(x: torch.Tensor, counts: torch.Tensor, group: dist.ProcessGroup
                    ) -> tuple[torch.Tensor, torch.Tensor, Exchange]:
    """Send the rows of ``x`` [N, hidden] (sorted by global expert, ``counts`` int64 [E]) to the ep ranks
    holding their experts (rank r holds experts r E_local ... (r+1) E_local - 1).

    Returns:
        The rows this rank's experts compute, sorted by local expert then source rank [M, hidden]; their
        counts per local expert int64 [E_local]; and the `Exchange` to send the outputs back.
    """
    ep = dist.get_world_size(group)
    num_local = counts.numel() // ep
    # counts.view(ep, E_local)[r] goes to rank r; received_counts.view(ep, E_local)[s] came from rank s.
    received_counts = wait_tensor(all_to_all_single(counts, None, None, group))
    send_splits = counts.view(ep, num_local).sum(dim=1).tolist()
    receive_splits = received_counts.view(ep, num_local).sum(dim=1).tolist()
    # The functional collective (differentiable; its backward is the reverse exchange), waited for at once.
    received = wait_tensor(all_to_all_single_autograd(x.contiguous(), receive_splits, send_splits, group))
    local_expert = torch.arange(num_local, device=x.device).repeat(ep)  # segment [source, local expert]
    order = torch.argsort(torch.repeat_interleave(local_expert, received_counts), stable=True)
    local_counts = received_counts.view(ep, num_local).sum(dim=0)
    return received[order], local_counts, Exchange(send_splits, receive_splits, order)


def receive_from_experts(y: torch.Tensor, exchange: Exchange, group: dist.ProcessGroup) -> torch.Tensor:
    """Inverse of `send_to_experts`: the outputs ``y`` [M, hidden] back on the ranks (and rows) their tokens
    came from, [N, hidden]."""
    unsorted = y[torch.argsort(exchange.order)]
    return wait_tensor(all_to_all_single_autograd(unsorted, exchange.send_splits, exchange.receive_splits, group))
