"""Auxiliary losses and metrics: what a model adds to its training loss besides the family's own loss
(load-balancing losses, say), and the per-step numbers it reports with them.

A module takes part by having:

- ``auxiliary_loss_scale`` (float attribute): set by the runner before each forward/backward to the factor
  the main loss's gradient carries (the fp16 loss scale over the micro-batches it averages);
  `attach_auxiliary_loss` uses it so the auxiliary loss's gradient is scaled exactly as the main loss's;
- ``auxiliary_metric_kinds() -> dict[str, str]``: its metric names and how each reduces ("mean", "max",
  "min"), the same on every rank whatever it holds;
- ``pop_auxiliary_metrics(last_forwards=None) -> dict[str, AuxiliaryMetric]``: what it recorded in its last
  ``last_forwards`` forward passes (all if None), merged; everything recorded is forgotten. The runner asks
  for the step's micro-batch count: a pipeline schedule's first step runs each stage once more beforehand, on
  placeholder tensors, to infer shapes, and that forward is no training.

The loss is attached to an activation (Megatron's ``MoEAuxLossAutoScaler`` idea): its gradient enters the
backward pass wherever the module sits, on any pipeline stage, and the family's loss function is unchanged.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

MEAN, MAX, MIN = "mean", "max", "min"
REDUCTIONS = (MEAN, MAX, MIN)


@dataclass(slots=True)
class AuxiliaryMetric:
    """One recorded value: a "mean" reports sum(value) / sum(weight) over records and ranks; "max"/"min"
    the largest/smallest value (weight unused)."""

    value: float
    weight: float = 1.0


class _AttachLoss(torch.autograd.Function):
    """Identity on the activation; in the backward pass, the auxiliary loss gets gradient ``scale``."""

    @staticmethod
    def forward(ctx, activation: torch.Tensor, loss: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.save_for_backward(loss)
        ctx.scale = scale
        return activation

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (loss,) = ctx.saved_tensors
        return grad, torch.full_like(loss, ctx.scale), None


def attach_auxiliary_loss(activation: torch.Tensor, loss: torch.Tensor, scale: float) -> torch.Tensor:
    """``activation`` unchanged, with ``loss`` (a scalar) joining the backward pass with gradient ``scale``."""
    if not loss.requires_grad:
        return activation
    return _AttachLoss.apply(activation, loss, scale)


def auxiliary_modules(parts: Iterable[nn.Module]) -> list[nn.Module]:
    """The modules of ``parts`` that report auxiliary metrics."""
    return [m for part in parts for m in part.modules() if hasattr(m, "pop_auxiliary_metrics")]


def metric_kinds(modules: Iterable[nn.Module]) -> dict[str, str]:
    """Metric name -> reduction, over ``modules`` (sorted by name: the same order on every rank)."""
    kinds: dict[str, str] = {}
    for module in modules:
        kinds |= module.auxiliary_metric_kinds()
    return dict(sorted(kinds.items()))


def set_auxiliary_loss_scale(modules: Iterable[nn.Module], scale: float) -> None:
    """The gradient the auxiliary losses of ``modules`` carry in the coming backward passes."""
    for module in modules:
        module.auxiliary_loss_scale = scale


def pop_metrics(modules: Iterable[nn.Module], last_forwards: int | None = None) -> dict[str, list[AuxiliaryMetric]]:
    """What ``modules`` recorded in their last ``last_forwards`` forward passes (all if None), by name; the
    records are cleared."""
    records: dict[str, list[AuxiliaryMetric]] = {}
    for module in modules:
        for name, metric in module.pop_auxiliary_metrics(last_forwards).items():
            records.setdefault(name, []).append(metric)
    return records


def reduce_metrics(records: dict[str, list[AuxiliaryMetric]], kinds: dict[str, str],
                   device: torch.device = torch.device("cpu"), group: dist.ProcessGroup | None = None
                   ) -> dict[str, float]:
    """The reported value of every metric of ``kinds`` over ``records`` and the ranks of ``group``.

    Collective over ``group`` (every rank passes the same ``kinds``) when the process group has more than one
    rank (``device``: where the backend reduces, the run's device). A metric nobody recorded is left out.
    """
    # One float64 vector for the sums (mean's value and weight) and one for the extremes (min negated).
    sums = torch.zeros(2 * len(kinds), dtype=torch.float64)
    extremes = torch.full((len(kinds),), -torch.inf, dtype=torch.float64)
    for index, (name, kind) in enumerate(kinds.items()):
        for metric in records.get(name, ()):
            if kind == MEAN:
                sums[2 * index] += metric.value
                sums[2 * index + 1] += metric.weight
            else:
                value = metric.value if kind == MAX else -metric.value
                extremes[index] = max(float(extremes[index]), value)
    if dist.is_initialized() and dist.get_world_size(group) > 1:
        sums, extremes = sums.to(device), extremes.to(device)
        dist.all_reduce(sums, group=group)
        dist.all_reduce(extremes, op=dist.ReduceOp.MAX, group=group)
        sums, extremes = sums.cpu(), extremes.cpu()
    reported: dict[str, float] = {}
    for index, (name, kind) in enumerate(kinds.items()):
        if kind == MEAN and sums[2 * index + 1] > 0:
            reported[name] = float(sums[2 * index] / sums[2 * index + 1])
        elif kind != MEAN and torch.isfinite(extremes[index]):
            reported[name] = float(extremes[index]) if kind == MAX else -float(extremes[index])
    return reported
