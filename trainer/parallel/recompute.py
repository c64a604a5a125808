"""Activation recomputation with Megatron's meaning (``--recompute-granularity/-method/-num-layers``).

A family's layer loop hands its layers to `run_layers` as one-argument calls; which of them run under
non-reentrant checkpointing (inputs saved, everything else recomputed in the backward pass) follows
megatron-core's ``checkpointed_forward`` over the layers this module holds (a pipeline stage's, as
Megatron counts per pipeline rank):

- ``full``/``uniform``/N: the layers in groups of N, each group one checkpoint (only its input is kept);
- ``full``/``block``/N: each of the first N layers its own checkpoint, the others run as usual;
- ``selective``: no layer is checkpointed; the core of each attention (softmax(q k^T) v, Megatron's
  ``core_attn``) is, through `core_attention` in every attention module that declares
  `RECOMPUTE_CORE_ATTENTION`.

Dropout inside a recomputed region draws the same masks again (checkpoint restores the random state;
keyed dropout takes the same keys), so the losses and gradients are those of a run without recomputation.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from trainer.errors import TrainConfigError

RECOMPUTE_GRANULARITIES = ("full", "selective")
RECOMPUTE_METHODS = ("uniform", "block")
RECOMPUTE_CORE_ATTENTION = "recompute_core_attention"
"""Attribute of an attention module (False by default): run its core under checkpointing (selective)."""

LayerCall = Callable[[torch.Tensor], torch.Tensor]


@dataclass(frozen=True, slots=True)
class Recompute:
    """What is recomputed: Megatron's granularity, method and number of layers (method and layers: full only)."""

    granularity: str
    method: str | None = None
    num_layers: int | None = None

    def groups(self, count: int) -> list[tuple[int, int, bool]]:
        """(start, stop, checkpointed) runs of ``count`` consecutive layers, in order."""
        if self.granularity == "selective":
            return [(0, count, False)]
        if self.method == "uniform":
            return [(start, min(start + self.num_layers, count), True) for start in range(0, count, self.num_layers)]
        recomputed = min(self.num_layers, count)
        return [(i, i + 1, True) for i in range(recomputed)] + ([(recomputed, count, False)] if recomputed < count
                                                                 else [])


EVERY_LAYER = Recompute("full", "uniform", 1)
"""``--checkpoint-activations``: every layer recomputed on its own."""


def as_recompute(setting: bool | Recompute | None) -> Recompute | None:
    """A model's ``checkpoint_activations`` attribute (True: `EVERY_LAYER`, False/None: nothing) as a policy."""
    if isinstance(setting, Recompute):
        return setting
    return EVERY_LAYER if setting else None


def _run_group(calls: Sequence[LayerCall], h: torch.Tensor) -> torch.Tensor:
    for call in calls:
        h = call(h)
    return h


def run_layers(calls: Sequence[LayerCall], h: torch.Tensor, setting: bool | Recompute | None) -> torch.Tensor:
    """Run ``calls`` (each layer of a stack with its other inputs bound) on ``h``, checkpointing the groups
    ``setting`` (a model's ``checkpoint_activations``) names.

    Non-reentrant checkpointing keeps working under DTensor, FSDP2 and the pipeline schedules, and takes
    tensors the calls capture (a T5 decoder's memory) as inputs of the recomputed region.
    """
    recompute = as_recompute(setting)
    if recompute is None or not torch.is_grad_enabled():
        return _run_group(calls, h)
    for start, stop, checkpointed in recompute.groups(len(calls)):
        group = calls[start:stop]
        h = checkpoint(_run_group, group, h, use_reentrant=False) if checkpointed else _run_group(group, h)
    return h


def core_attention(module: nn.Module, function: Callable[..., torch.Tensor], *args: Any, **kwargs: Any) -> torch.Tensor:
    """``function(*args, **kwargs)``, the attention core of ``module``; under checkpointing when ``module``'s
    `RECOMPUTE_CORE_ATTENTION` is set and gradients are being recorded."""
    if getattr(module, RECOMPUTE_CORE_ATTENTION, False) and torch.is_grad_enabled():
        return checkpoint(function, *args, use_reentrant=False, **kwargs)
    return function(*args, **kwargs)


def apply_recompute(model: nn.Module, recompute: Recompute) -> None:
    """Set ``model`` (a family's model or pipeline stage) to recompute as ``recompute`` says: its layer loops
    read its ``checkpoint_activations`` attribute; selective granularity marks its attention modules.

    Raises:
        TrainConfigError: selective granularity for a model with no attention module that declares
            `RECOMPUTE_CORE_ATTENTION`.
    """
    if recompute.granularity == "full":
        model.checkpoint_activations = recompute
        return
    marked = [module for module in model.modules() if hasattr(module, RECOMPUTE_CORE_ATTENTION)]
    if not marked:
        raise TrainConfigError(f"recompute_granularity selective is not implemented for {type(model).__name__} "
                               "models")
    for module in marked:
        setattr(module, RECOMPUTE_CORE_ATTENTION, True)
