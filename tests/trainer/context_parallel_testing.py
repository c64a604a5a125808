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


def dropout_attention_errors(seq_len: int, groups: int, p: float = 0.5, seed: int = 0) -> dict[str, float]:
    """Max abs difference of this rank's attention output and q/k/v gradients, with attention dropout ``p``, from
    the same blocks differentiated by autograd directly (keys/values of the whole sequence on every rank, no
    recompute, the same random state): the backward's recompute draws the forward's dropout masks, though other
    draws come between."""
    torch.manual_seed(seed)
    q, k, v = (torch.randn(BATCH, heads, seq_len, HEAD_DIM, dtype=torch.float64)
               for heads in (HEADS, groups, groups))
    weight = torch.randn(BATCH, HEADS, seq_len, HEAD_DIM, dtype=torch.float64)
    repeat = HEADS // groups
    context = ContextParallel(dist.group.WORLD)
    layout = context.layout
    local_q, local_weight = layout.shard(q, dim=2).requires_grad_(), layout.shard(weight, dim=2)
    full_k, full_v = k.clone().requires_grad_(), v.clone().requires_grad_()

    def attend(q_block, k_block, v_block, mask):
        return F.scaled_dot_product_attention(q_block, k_block, v_block, attn_mask=mask, dropout_p=p)

    torch.manual_seed(seed + 1)
    reference = torch.cat([attend(local_q[:, :, queries], full_k[:, :, :keys].repeat_interleave(repeat, 1),
                                  full_v[:, :, :keys].repeat_interleave(repeat, 1), mask)
                           for queries, keys, mask in context.blocks(seq_len // layout.size, q.dtype, q.device)], 2)
    (reference * local_weight).sum().backward()
    for full in (full_k, full_v):
        dist.all_reduce(full.grad)  # every rank's queries used every rank's keys
    local = [layout.shard(t, dim=2).requires_grad_() for t in (q, k, v)]
    torch.manual_seed(seed + 1)
    out = context.attention(*local, repeat, attend=attend)
    torch.rand(7)  # other layers' draws between the forward and the backward
    (out * local_weight).sum().backward()
    errors = {"out": (out - reference).abs().max().item(),
              "dq": (local[0].grad - local_q.grad).abs().max().item()}
    for name, full, part in (("dk", full_k, local[1]), ("dv", full_v, local[2])):
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
