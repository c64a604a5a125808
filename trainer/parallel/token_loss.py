"""How a micro-batch's loss is weighted by its loss tokens: context parallelism's share of a sequence mean, and
Megatron's ``--calculate-per-token-loss`` (the mean over all loss tokens of the global batch).

A family's loss (`trainer.parallel.plan.ParallelPlan.loss`) is the mean over the targets that are not
IGNORE_INDEX. Each rank turns it into ``mean * count / tokens_per_loss`` (`weighted_token_loss`; ``count``: its
own loss tokens), and the runner then treats that value exactly as it treats a plain micro-batch mean: the backward
of its sum over the M micro-batches divided by M, the gradients averaged over the R = dp x cp replicas (DDP,
FSDP2, ZeRO), the reported loss the average over micro-batches and replicas. The divisor decides the meaning:

- context parallelism, per micro-batch: ``tokens_per_loss = T / cp`` (T: the micro-batch's loss tokens on all cp
  ranks), which gives the gradient and the report of the sequence mean;
- per-token loss, per step: ``tokens_per_loss = N / (M x R)`` (N: the loss tokens of the whole global batch, all
  micro-batches and replicas; `step_tokens_per_loss`). Summed over micro-batches and averaged over replicas the
  weights then give sum / N: Megatron's gradient (its loss sums, not divided by M, every gradient scaled by
  1 / N after the data-parallel sum in ``finalize_model_grads``) and its reported loss (sum / count over the
  global batch). The factor is known before the forward, so it is applied once, on the loss: gradient clipping
  and the gradient norm see the final gradients, fp16's gradients keep the size of a mean's, and auxiliary losses
  (`trainer.optim.auxiliary_losses`) keep their 1 / M scale, as in Megatron (its routers pre-multiply theirs by the
  token count that the 1 / N scaling then cancels).

    tokens_per_loss = step_tokens_per_loss([targets of each micro-batch], replicas=2, group=dp_group)
    loss = weighted_token_loss(token_cross_entropy, logits, targets, tokens_per_loss)
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist

from trainer.data.batches import IGNORE_INDEX

# Megatron's finalize_model_grads clamps the global token count to at least this, so that a batch whose every
# target is masked gives zero gradients instead of a division by zero.
MIN_STEP_TOKENS = 1


def loss_token_count(targets: torch.Tensor) -> torch.Tensor:
    """int64 scalar: the targets a loss is taken at (not IGNORE_INDEX), on the targets' device."""
    return (targets != IGNORE_INDEX).sum()


def weighted_token_loss(loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], outputs: torch.Tensor,
                        targets: torch.Tensor, tokens_per_loss: torch.Tensor | float) -> torch.Tensor:
    """``loss_fn``'s mean over this rank's loss tokens times their count / ``tokens_per_loss`` (a float32 scalar).

    Args:
        loss_fn: (outputs, targets) -> the mean loss over the targets that are not IGNORE_INDEX (a scalar).
        outputs: this rank's model outputs of the micro-batch.
        targets: int64 [batch, local seq], IGNORE_INDEX where no loss is taken.
        tokens_per_loss: the loss tokens one returned value stands for (see the module docstring); > 0.
    """
    count = loss_token_count(targets)
    # With no target here the mean would be NaN (and its gradient too): the loss of a finite stand-in (every
    # target 0) times the count 0 adds nothing, and keeps any collective inside loss_fn (tensor parallelism's
    # loss_parallel) in step with the other ranks. Chosen on the device, so no micro-batch waits for the count.
    targets = torch.where(count > 0, targets, torch.zeros_like(targets))
    return loss_fn(outputs, targets) * (count / tokens_per_loss)


def step_tokens_per_loss(targets: list[torch.Tensor], replicas: int,
                         group: dist.ProcessGroup | None) -> torch.Tensor:
    """Per-token loss's divisor of one step: N / (M x R), a float32 scalar on the targets' device.

    Args:
        targets: this rank's targets of each of the step's M micro-batches (its cp share of the sequences).
        replicas: R, the ranks that hold other tokens of the step (data parallel x context parallel).
        group: those ranks' group (one all-reduce of the count); None when R is 1.
    """
    total = sum(loss_token_count(t) for t in targets)
    if group is not None:
        dist.all_reduce(total, group=group)
    return total.clamp(min=MIN_STEP_TOKENS).float() / (len(targets) * replicas)
