"""`ModelSpec`: everything family-specific that the generic machinery (the loop, checkpoints, the CLIs)
asks a model family. One spec per family, registered by name in `trainer.models`, which hands the specs to the
core from the top (the CLIs, `train()`); the core never imports a family or the registry, and never tests a
family's name.

Adding a family is adding a folder `trainer/models/<name>/` whose `spec.py` holds its `SPEC`, and one
line in `trainer.models.FAMILIES` (and, for a family with flags of its own, its `settings.py` and one line in
`trainer.models.FAMILY_SETTINGS`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torch import nn

from trainer.config import TrainConfig
from trainer.data.batches import MicroBatch, Vocabulary
from trainer.parallel.plan import FamilyLayout, ParallelPlan, Shape

if TYPE_CHECKING:  # annotations only (importing them here would load every command's module)
    from trainer.evaluation.scoring import ScoringSource
    from trainer.generation.generate import Completion, GenerateConfig
    from trainer.checkpoint.hf_convert import ConvertCheckpointConfig


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
    default_tokenizer_type: str = "GPT2BPETokenizer"
    """The ``--tokenizer-type`` of a run that names none (Megatron's pretrain_<family>.py sets it per family)."""
    unused_fields: tuple[str, ...] = ()
    """Core `TrainConfig` field names the family never reads (``seq_length`` for T5): ``train`` refuses each one
    the user gives, naming its flag, instead of ignoring it (with the fields of the other families' sections:
    `trainer.models.unused_fields`)."""
    settings: type | None = None
    """The dataclass of the family's own flag section, kept in `TrainConfig.families` under the family's name
    (``train --help``'s group of that name); None: the family reads core sections only."""
    sequence_lengths: tuple[tuple[str, str], ...] = (("model", "seq_length"),)
    """The (section, field) pairs of the run's sequence lengths, recorded beside its checkpoints
    (`trainer.checkpoint.lengths`)."""
    fused_qkv: bool = False
    """Whether the family can compute q, k and v with one linear (``fused_qkv``); ``train`` refuses it otherwise."""
    plain_bin_reads: bool = False
    """Whether the family's data can be read without memory maps (``no_mmap_bin_files``)."""
    stack_layers: Callable[[TrainConfig], int] | None = None
    """The layers of the family's deepest stack, from which every stack counts its MoE layers
    (``moe_layer_offset`` must be below it); None: ``num_layers``."""
    scoring_source: Callable[[str, int], ScoringSource] | None = None
    """``evaluate`` and lm-eval's ``tokenmill`` model: (checkpoint or HF directory, tensor-parallel size) -> the
    model to score with, in any tp x pp x dp layout (`trainer.evaluation.scoring.ScoringSource`); None: the
    family is not evaluated."""
    tasks: tuple[tuple[str, str], ...] = ()
    """The `trainer.Trainer` tasks the family owns: (MindFormers' task name, the module whose ``TASK`` class runs
    it), such as ``("question_answering", "trainer.models.bert.squad.task")``; the module is imported only when
    the task is asked for."""


def section_fields(*sections: type) -> tuple[str, ...]:
    """The field names of `TrainConfig` sections (``section_fields(MaskingConfig)``), for `ModelSpec.unused_fields`."""
    return tuple(f.name for section in sections for f in fields(section))
