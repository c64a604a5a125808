"""Each command's dispatch to the model family of its source, found by the registry (`trainer.models`): the
entry points that the CLIs and Python callers use, so that the core below them never imports the registry.

    convert_checkpoint(ConvertCheckpointConfig(from_hf="gpt2/", to="checkpoints/gpt2"))
    convert_checkpoint(ConvertCheckpointConfig(from_checkpoint="checkpoints/run1", to_hf="gpt2-finetuned/"))
    completions = generate(GenerateConfig(load="gpt2/", prompts=["Hello, my name is"], max_new_tokens=20,
                                          sampling=SamplingConfig(greedy=True)))
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from trainer.checkpoint.hf_convert import ConvertCheckpointConfig
from trainer.checkpoint.lengths import sequence_length_defaults
from trainer.checkpoint.store import MODEL_CONFIG_FILE, resolve_checkpoint
from trainer.errors import TrainConfigError
from trainer.evaluation.scoring import ScoringSource
from trainer.generation.generate import Completion, GenerateConfig
from trainer.models import (
    FAMILIES,
    length_sections,
    model_spec,
    spec_for_checkpoint,
    spec_for_hf_directory,
    spec_for_source,
)


def checkpoint_train_defaults(root: str | os.PathLike) -> dict[str, dict[str, Any]]:
    """Defaults that ``train --load ROOT`` takes from a checkpoint root, by `TrainConfig` section: what its
    family's spec reads from ``model_config.json`` and the tokenizer files, and the sequence lengths
    (`trainer.checkpoint.lengths`). {} for a root without a model
    config (an empty directory: training starts from scratch)."""
    if not (Path(root) / MODEL_CONFIG_FILE).is_file():
        return {}
    sections = spec_for_checkpoint(root).checkpoint_train_defaults(root)
    for section, values in sequence_length_defaults(root, length_sections()).items():
        sections[section] = {**sections.get(section, {}), **values}
    return sections


def convert_checkpoint(config: ConvertCheckpointConfig) -> Path:
    """Run one conversion; returns what was written (the checkpoint directory or the HF directory)."""
    if config.from_hf is not None:
        return spec_for_hf_directory(config.from_hf).import_hf_checkpoint(config)
    root, _ = resolve_checkpoint(config.from_checkpoint)
    return spec_for_checkpoint(root).export_hf_checkpoint(config)


def check_generation(config: GenerateConfig, world_size: int) -> None:
    """Check a run on ``world_size`` processes before any starts (what every rank would reject).

    Raises:
        TokenmillError: the model, tokenizer, prompts or layout are wrong (one clear message).
    """
    spec_for_source(config.load).check_generation(config, world_size)


def generate(config: GenerateConfig) -> list[Completion]:
    """Generate a continuation of every prompt with the family of ``config.load`` (collective: every process
    of the group calls it).

    Returns:
        One `Completion` per prompt, in order (texts first, then id prompts), on every rank.

    Raises:
        TokenmillError: a missing/mismatched model, tokenizer or layout (one clear message), raised
            on every rank before the first collective.
    """
    return spec_for_source(config.load).generate(config)


def resolve_scoring_source(load: str, tp: int) -> ScoringSource:
    """The model of ``load`` (checkpoint or HF directory) as its family scores it, for
    `trainer.evaluation.scoring.open_eval_model` and `trainer.evaluation.evaluate.evaluate`.

    Raises:
        TrainConfigError: the family is not evaluated (naming it and those that are).
        TokenmillError: the family's own complaint about ``load`` (one clear message).
    """
    spec = spec_for_source(load)
    if spec.scoring_source is None:
        evaluated = [name for name in FAMILIES if model_spec(name).scoring_source is not None]
        raise TrainConfigError(f"{load} is a {spec.name} model; evaluation scores {', '.join(evaluated)} models only")
    return spec.scoring_source(load, tp)
