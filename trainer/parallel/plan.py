"""How the parallel machinery sees a model family: its `ParallelPlan` (build, split into pipeline stages,
shard, feed; `trainer.parallel.runner.ParallelModel` runs it) and its own `FamilyLayout` rules
(`resolve_parallel_dims` adds the shared ones). A family's `ModelSpec`
(`trainer.family.spec`) holds both; the parallel machinery never asks which family it runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from trainer.data.batches import MicroBatch, token_cross_entropy

Shape = Any
"""A family's resolved model dimensions (`GPTShape`, `T5Shape`): vocabulary already padded."""


@dataclass(frozen=True, slots=True)
class FamilyLayout:
    """A family's own layout rules for a run (`resolve_parallel_dims` adds the shared ones)."""

    rules: list[tuple[bool, str]]
    """(holds, the one-line message when it does not) for each rule, checked in order."""
    num_layers: int
    """Blocks the pipeline stages divide."""
    layers_name: str
    """How a message names them (the flags that set them, with their values)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ParallelPlan:
    """How `trainer.parallel.runner.ParallelModel` builds, splits, shards and feeds a family's model.

    The module ``build`` returns (and every stage ``split_stage`` makes of it) keeps full-model parameter
    names, and has ``init_parameter(name, tensor)`` (the family's initialisation of one full-size
    parameter), ``tie_weights()`` (re-tie after allocation; a no-op for untied models) and a
    ``checkpoint_activations`` attribute its forward honours.
    """

    build: Callable[[Shape], nn.Module]
    """The full model, on the current default device (the runner builds it on ``meta``)."""
    num_layers: Callable[[Shape], int]
    """Blocks the pipeline stages divide."""
    split_stage: Callable[[nn.Module, int, int], nn.Module]
    """(full model, stage id, number of stages) -> that pipeline stage.
    Raises `trainer.errors.TrainConfigError` when the layers do not divide."""
    apply_tp: Callable[[nn.Module, DeviceMesh, bool], None]
    """(part, tp mesh, sequence parallel): shard a part in place. Raises `TrainConfigError` for a size that
    does not divide or a mode the family lacks."""
    blocks: Callable[[nn.Module], list[nn.Module]]
    """A part's transformer blocks: compiled one by one under ``--compile`` where the model is wrapped (more
    than one process), one FSDP2 unit each (`trainer.parallel.parallelize.apply_fsdp`)."""
    tied_names: Callable[[Shape], tuple[str, str] | None]
    """(embedding name, name of the last pipeline stage's copy) of a tied input/output weight; None if untied."""
    model_inputs: Callable[[MicroBatch], tuple[torch.Tensor, ...]]
    """The tensors a micro-batch feeds the model (the first pipeline stage), in ``forward``'s order."""
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = token_cross_entropy
    """(the last stage's outputs, the micro-batch's ``targets``) -> the mean loss of the micro-batch, a
    scalar (under tensor parallelism computed inside ``loss_parallel``)."""
    to_checkpoint: Callable[[dict[str, torch.Tensor], Shape], dict[str, torch.Tensor]] | None = None
    """A run's state under the names checkpoints hold, for a model that computes in another layout
    (GPT's fused q/k/v); None: the run's names are the checkpoint's."""
    from_checkpoint: Callable[[dict[str, torch.Tensor], dict[str, torch.Tensor], Shape], None] | None = None
    """The inverse of ``to_checkpoint``: (loaded, state, shape) fills ``state`` in place."""
    model_kwargs: Callable[[MicroBatch], dict[str, torch.Tensor]] = lambda mb: {}
    """Keyword inputs of a micro-batch beside ``model_inputs`` (GPT's --reset-attention-mask document mask);
    given to an unpipelined model only (a family refuses them under pipelining in its layout rules)."""
