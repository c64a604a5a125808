"""Jobs of the context-parallel tests, run in spawned gloo processes (`process_testing.run_jobs`): each rank
computes its share with `trainer.parallel.context` and compares it with one process's result."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from trainer.data.batches import IGNORE_INDEX, token_cross_entropy
from trainer.parallel.context import ContextParallel, context_parallel_loss

# Reference inputs: batch, query heads, head dim (the sequence and group counts come from the test).
BATCH, HEADS, HEAD_DIM = 2, 4, 8


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def attention_errors(seq_len: int, groups: int, seed: int = 0) -> dict[str, float]:
    """Max abs difference of this rank's attention output and q/k/v gradients (keys/values of ``groups``
    groups, gathered over all ranks) from one process's causal attention over the whole sequence."""
    torch.manual_seed(seed)
    q = torch.randn(BATCH, HEADS, seq_len, HEAD_DIM, dtype=torch.float64, requires_grad=True)
    k, v = (torch.randn(BATCH, groups, seq_len, HEAD_DIM, dtype=torch.float64, requires_grad=True) for _ in range(2))
    weight = torch.randn(BATCH, HEADS, seq_len, HEAD_DIM, dtype=torch.float64)
    repeat = HEADS // groups
    out = F.scaled_dot_product_attention(q, k.repeat_interleave(repeat, 1), v.repeat_interleave(repeat, 1),
                                         is_causal=True)
    (out * weight).sum().backward()
    context = ContextParallel(dist.group.WORLD)
    layout = context.layout
    local = [layout.shard(t.detach(), dim=2).requires_grad_() for t in (q, k, v)]
    out_local = context.attention(*local, repeat, attend=_sdpa)
    (out_local * layout.shard(weight, dim=2)).sum().backward()
    errors = {"out": (out_local - layout.shard(out.detach(), dim=2)).abs().max().item()}
    for name, full, part in zip(("dq", "dk", "dv"), (q, k, v), local):
        errors[name] = (part.grad - layout.shard(full.grad, dim=2)).abs().max().item()
    return errors


def loss_error(seq_len: int, vocab: int = 16, seed: int = 0) -> float:
    """|sum over cp ranks of `context_parallel_loss` / cp - the sequence's mean loss|, with some targets ignored
    (unevenly over the ranks)."""
    torch.manual_seed(seed)
    logits = torch.randn(BATCH, seq_len, vocab, dtype=torch.float64)
    targets = torch.randint(0, vocab, (BATCH, seq_len))
    targets[:, : seq_len // 3] = IGNORE_INDEX
    layout = ContextParallel(dist.group.WORLD).layout
    share = context_parallel_loss(token_cross_entropy, layout.shard(logits), layout.shard(targets), dist.group.WORLD)
    total = share.detach().clone()
    dist.all_reduce(total)
    return abs(total.item() / layout.size - token_cross_entropy(logits, targets).item())
