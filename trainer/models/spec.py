"""`ModelSpec`: everything family-specific that the generic machinery (the loop, checkpoints, the CLIs)
asks a model family. One spec per family, registered by name in `trainer.models`; the core never tests
a family's name.

Adding a family is adding a folder `trainer/models/<name>/` whose `spec.py` holds its `SPEC`, and one
line in `trainer.models.FAMILIES`.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from trainer.config import TrainConfig
from trainer.data.batches import MicroBatch, Vocabulary, token_cross_entropy

if TYPE_CHECKING:  # annotations only: these modules ask the registry, which imports the specs
    from trainer.evaluation.scoring import ScoringSource
    from trainer.generation.generate import Completion, GenerateConfig
    from trainer.checkpoint.hf_convert import ConvertCheckpointConfig

Shape = Any
"""A family's resolved model dimensions (`GPTShape`, `T5Shape`): vocabulary already padded."""


@dataclass(frozen=True, slots=True)
class TrainingParts:
    """What one training run of a family is made of, resolved from its config (before any collective)."""

    vocabulary: Vocabulary
    shape: Shape
    datasets: tuple[Any, Any, Any]
    """The train, valid and test datasets (None where a split is absent)."""
    collate: Callable[[list[dict], int], MicroBatch]
    """Dataset items -> one micro-batch (checking ids against the vocabulary size)."""
    tokens_per_sample: int
    """Positions a sample trains, padding included (for tokens/s, which therefore counts positions: T5's
    encoder + decoder lengths, not the real tokens a span-corruption sample fills)."""
    flops_per_token: float
    """Training FLOPs per position (for TFLOP/s and MFU)."""


@dataclass(frozen=True, slots=True)
class FamilyLayout:
    """A family's own layout rules for a run (`trainer.parallel.dims.resolve_parallel_dims` adds the shared ones)."""

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
    """A part's transformer blocks: compiled one by one under ``--compile``, one FSDP2 unit each
    (`trainer.parallel.parallelize.apply_fsdp`)."""
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


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelSpec:
    """A model family, as the core sees it."""

    name: str
    """What ``--model`` and a checkpoint's ``model_config.json`` call it."""
    hf_model_types: tuple[str, ...]
    """The ``model_type`` values of the Hugging Face ``config.json`` files it imports."""
    training_parts: Callable[[TrainConfig, int, tuple[int, int, int]], TrainingParts]
    """(config, tensor-parallel size, samples per split) -> the run's vocabulary, shape, data and costs."""
    layout_rules: Callable[[TrainConfig, int], FamilyLayout]
    """(config, tensor-parallel size) -> the family's layout rules, checked before any collective."""
    parallel_plan: ParallelPlan
    """How the generic `trainer.parallel.runner.ParallelModel` builds, parallelises and feeds the model."""
    checkpoint_model: Callable[[Shape], nn.Module]
    """The full model on the meta device, with the parameter names checkpoints hold."""
    vocab_rows: tuple[str, ...]
    """Parameters whose rows are the padded vocabulary (re-padded when a checkpoint changes layout)."""
    load_hf_weights: Callable[[list, str | os.PathLike, Shape], str]
    """Fill this rank's parameters from a HF directory in place; returns the HF model type to record."""
    save_model_config: Callable[[str | os.PathLike, Shape, Vocabulary, str], None]
    """Write ``model_config.json`` into a checkpoint root: what the tensors cannot tell."""
    hf_train_defaults: Callable[[str | os.PathLike], dict[str, dict[str, Any]]]
    """``train --load-hf DIR``'s defaults (shape, tokenizer), by `TrainConfig` section."""
    checkpoint_train_defaults: Callable[[str | os.PathLike], dict[str, dict[str, Any]]]
    """``train --load CHECKPOINT``'s defaults, from its ``model_config.json`` and tokenizer files."""
    import_hf_checkpoint: Callable[[ConvertCheckpointConfig], Path]
    """``convert-checkpoint --from-hf DIR --to ROOT``: a model-only checkpoint at iteration 0."""
    export_hf_checkpoint: Callable[[ConvertCheckpointConfig], Path]
    """``convert-checkpoint --from ROOT --to-hf DIR``: a directory ``from_pretrained`` loads."""
    generate: Callable[[GenerateConfig], list[Completion]]
    """``generate``: completions of the prompts, from a checkpoint or a HF directory of the family."""
    check_generation: Callable[[GenerateConfig, int], None]
    """(config, world size): raise what every rank of ``generate`` would, before any process starts."""
    parallel_generation: bool
    """Whether ``generate`` runs split over processes (tensor/pipeline/data parallel)."""
    unused_fields: tuple[str, ...] = ()
    """`TrainConfig` field names the family never reads (``seq_length`` for T5, the t5 section for GPT):
    ``train`` refuses each one the user gives, naming its flag, instead of ignoring it."""
    scoring_source: Callable[[str, int], ScoringSource] | None = None
    """``evaluate`` and lm-eval's ``tokenmill`` model: (checkpoint or HF directory, tensor-parallel size) -> the
    model to score with, in any tp x pp x dp layout (`trainer.evaluation.scoring.ScoringSource`); None: the
    family is not evaluated."""


def section_fields(*sections: type) -> tuple[str, ...]:
    """The field names of `TrainConfig` sections (``section_fields(T5Config)``), for `ModelSpec.unused_fields`."""
    return tuple(f.name for section in sections for f in fields(section))
