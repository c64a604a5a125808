"""The router: a linear map to one logit per expert, top-k selection and its two auxiliary losses.

Computed in float32 whatever the autocast dtype (as Megatron and Switch Transformers do): the softmax over
experts and the logsumexp of the z-loss are sensitive to rounding. ``--moe-router-dtype fp64`` computes them in
float64 instead.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

# Megatron's --moe-router-dtype: what the router's logits, softmax and auxiliary losses compute in.
ROUTER_TORCH_DTYPES = {"fp32": torch.float32, "fp64": torch.float64}
ROUTER_DTYPES = tuple(ROUTER_TORCH_DTYPES)
# Megatron's --moe-router-load-balancing-type: over the micro-batch's tokens, per sequence, or no such loss.
LOAD_BALANCING_TYPES = ("aux_loss", "seq_aux_loss", "none")


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

    def __init__(self, hidden_size: int, num_experts: int, dtype: str = "fp32") -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_experts, hidden_size))
        self.dtype = ROUTER_TORCH_DTYPES[dtype]

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens [T, hidden] -> logits [T, E] in the router's dtype (float32 or float64)."""
        # F.linear: the kernel of an nn.Linear router (transformers' Switch), so imported models match to the ulp.
        # Outside autocast, which would compute it in bf16/fp16 whatever its inputs' dtype.
        with torch.autocast(tokens.device.type, enabled=False):
            return F.linear(tokens.to(self.dtype), self.weight.to(self.dtype))


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


def load_balancing_loss(probs: torch.Tensor, counts: torch.Tensor, top_k: int,
                        counted_tokens: int | None = None) -> torch.Tensor:
    """Switch/GShard load-balancing loss E * sum_e f_e P_e (1.0 when perfectly balanced).

    f_e = counts[e] / (T k) is the fraction of assignments expert e receives (not differentiable), P_e the
    mean router probability of e over the T tokens (differentiable). Megatron's
    ``switch_load_balancing_loss_func`` without its coefficient. With a leading group dimension (``probs``
    [G, T, E], ``counts`` [G, E]): the mean over the groups of each group's loss.

    ``counted_tokens``: the tokens (per group) ``counts`` counts, when they are more than ``probs``' T: under
    context parallelism ``counts`` are the whole sequence's (summed over the cp ranks) while ``probs`` are this
    rank's tokens; the mean over the cp ranks of the results is then the whole sequence's loss.
    """
    num_tokens, num_experts = probs.shape[-2:]
    fraction = counts.to(probs.dtype) / ((counted_tokens or num_tokens) * top_k)
    return (num_experts * (fraction * probs.mean(dim=-2)).sum(dim=-1)).mean()


def per_sequence(probs: torch.Tensor, experts: torch.Tensor, num_sequences: int) -> tuple[torch.Tensor, torch.Tensor]:
    """What Megatron's ``sequence_load_balancing_loss_func`` (DeepSeek-V2) balances: `load_balancing_loss` of the
    two is the mean over the ``num_sequences`` sequences of each one's loss.

    Args:
        probs: float [T, E], the tokens of consecutive sequences of equal length, sequence by sequence.
        experts: int64 [T, k], the chosen experts.

    Returns:
        float [S, T/S, E] (``probs`` by sequence) and int64 [S, E] (assignments per expert of each sequence).
    """
    num_experts = probs.shape[-1]
    # One bincount: sequence s's expert e is bin s E + e.
    offsets = torch.arange(num_sequences, device=experts.device)[:, None] * num_experts
    counts = expert_counts(experts.view(num_sequences, -1) + offsets, num_sequences * num_experts)
    return probs.view(num_sequences, -1, num_experts), counts.view(num_sequences, num_experts)


def z_loss(logits: torch.Tensor) -> torch.Tensor:
    """ST-MoE's router z-loss: mean over tokens of logsumexp(logits)^2 (keeps the logits small)."""
    return torch.logsumexp(logits, dim=-1).square().mean()
