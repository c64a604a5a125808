"""The router: a linear map to one logit per expert, top-k selection and its two auxiliary losses.

Computed in float32 whatever the autocast dtype (as Megatron and Switch Transformers do): the softmax over
experts and the logsumexp of the z-loss are sensitive to rounding.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True, slots=True)
class Routing:
    """Where each token goes: T tokens, k choices each."""

    experts: torch.Tensor
    """int64 [T, k]: chosen expert ids, best first."""
    weights: torch.Tensor
    """float32 [T, k]: the gate each chosen expert's output is multiplied by."""
    probs: torch.Tensor
    """float32 [T, E]: softmax over all experts (what the load-balancing loss weighs)."""


class Router(nn.Module):
    """``weight`` [E, hidden] (an ``nn.Linear`` without bias): hidden states -> expert logits."""

    def __init__(self, hidden_size: int, num_experts: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_experts, hidden_size))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens [T, hidden] -> logits float32 [T, E]."""
        # F.linear: the kernel of an nn.Linear router (transformers' Switch), so imported models match to the ulp.
        return F.linear(tokens.float(), self.weight.float())


def route(logits: torch.Tensor, top_k: int, pre_softmax: bool) -> Routing:
    """Top-k experts per token and their gates, from logits float32 [T, E].

    ``pre_softmax``: gates are the top-k entries of the softmax over all experts (Switch, DeepSpeed); else
    the softmax over the top-k logits only (Megatron's default; top-1 then gates with 1).
    Ties go to the lower expert id (`torch.topk` on CPU and CUDA).
    """
    probs = torch.softmax(logits, dim=-1)
    if pre_softmax:
        weights, experts = torch.topk(probs, top_k, dim=-1)
    else:
        top_logits, experts = torch.topk(logits, top_k, dim=-1)
        weights = torch.softmax(top_logits, dim=-1)
    return Routing(experts=experts, weights=weights, probs=probs)


def expert_counts(experts: torch.Tensor, num_experts: int) -> torch.Tensor:
    """int64 [E]: assignments per expert of ``experts`` int64 [T, k] (every slot counted)."""
    return torch.bincount(experts.reshape(-1), minlength=num_experts)


def load_balancing_loss(probs: torch.Tensor, counts: torch.Tensor, top_k: int) -> torch.Tensor:
    """Switch/GShard load-balancing loss E * sum_e f_e P_e (1.0 when perfectly balanced).

    f_e = counts[e] / (T k) is the fraction of assignments expert e receives (not differentiable), P_e the
    mean router probability of e over the T tokens (differentiable). Megatron's
    ``switch_load_balancing_loss_func`` without its coefficient.
    """
    num_tokens, num_experts = probs.shape
    fraction = counts.to(probs.dtype) / (num_tokens * top_k)
    return num_experts * (fraction * probs.mean(dim=0)).sum()


def z_loss(logits: torch.Tensor) -> torch.Tensor:
    """ST-MoE's router z-loss: mean over tokens of logsumexp(logits)^2 (keeps the logits small)."""
    return torch.logsumexp(logits, dim=-1).square().mean()
