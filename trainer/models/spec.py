"""`ModelSpec`: everything family-specific that the generic machinery (the loop, checkpoints, the CLIs)
asks a model family. One spec per family, registered by name in `trainer.models`; the core never tests
a family's name.

Adding a family is adding a folder `trainer/models/<name>/` whose `__init__.py` holds its `SPEC`, and one
line in `trainer.models.SPECS`.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torch import nn

from trainer.config import TrainConfig
from trainer.data import MicroBatch, Vocabulary
from trainer.runner import ParallelModel

if TYPE_CHECKING:  # annotations only: these modules ask the registry, which imports the specs
    from trainer.generate import Completion, GenerateConfig
    from trainer.hf_convert import ConvertCheckpointConfig

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
    """Positions a sample trains (for tokens/s)."""
    flops_per_token: float
    """Training FLOPs per position (for TFLOP/s and MFU)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelSpec:
    """A model family, as the core sees it."""

    name: str
    """What ``--model`` and a checkpoint's ``model_config.json`` call it."""
    hf_model_types: tuple[str, ...]
    """The ``model_type`` values of the Hugging Face ``config.json`` files it imports."""
    training_parts: Callable[[TrainConfig, int, tuple[int, int, int]], TrainingParts]
    """(config, tensor-parallel size, samples per split) -> the run's vocabulary, shape, data and costs."""
    parallel_model: Callable[..., ParallelModel]
    """`ParallelModel`'s constructor for this family: (shape, dims, mesh, parallelism, device, seed,
    checkpoint_activations, autocast_dtype, compile_blocks=False)."""
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
    parallel_generation: bool
    """Whether ``generate`` runs split over processes (tensor/pipeline/data parallel)."""
