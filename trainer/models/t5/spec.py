"""T5 and mT5's `ModelSpec`: what the loop, checkpoints and CLIs ask of the family."""

from __future__ import annotations

from pathlib import Path

from trainer.data import Vocabulary
from trainer.checkpoint import resolve_checkpoint
from trainer.hf_convert import DEFAULT_DIVISIBLE_BY, ConvertCheckpointConfig
from trainer.models.spec import ModelSpec
from trainer.models.t5.convert import (
    T5_MODEL,
    VOCAB_ROWS,
    export_t5_checkpoint,
    import_hf_t5_checkpoint,
    load_hf_t5_weights,
    save_t5_model_config,
    t5_checkpoint_train_defaults,
    t5_train_defaults,
)
from trainer.models.t5.generate import generate_t5
from trainer.models.t5.hf import T5_ARCHITECTURES
from trainer.models.t5.model import T5, T5Shape
from trainer.models.t5.runner import ParallelT5
from trainer.models.t5.training import training_parts


def _save_model_config(root, shape: T5Shape, vocabulary: Vocabulary, hf_model_type: str) -> None:
    save_t5_model_config(root, shape, vocabulary.size, vocabulary.eod_id, vocabulary.pad_id, hf_model_type)


def _import_hf_checkpoint(config: ConvertCheckpointConfig) -> Path:
    return import_hf_t5_checkpoint(config.from_hf, config.to,
                                   config.make_vocab_size_divisible_by or DEFAULT_DIVISIBLE_BY,
                                   config.tensor_model_parallel_size or 1)


def _export_hf_checkpoint(config: ConvertCheckpointConfig) -> Path:
    root, iteration = resolve_checkpoint(config.from_checkpoint)
    return export_t5_checkpoint(root, iteration, config.to_hf, verify=not config.no_verify)


SPEC = ModelSpec(
    name=T5_MODEL,
    hf_model_types=tuple(T5_ARCHITECTURES),
    training_parts=training_parts,
    parallel_model=ParallelT5,
    checkpoint_model=T5,
    vocab_rows=VOCAB_ROWS,
    load_hf_weights=load_hf_t5_weights,
    save_model_config=_save_model_config,
    hf_train_defaults=t5_train_defaults,
    checkpoint_train_defaults=t5_checkpoint_train_defaults,
    import_hf_checkpoint=_import_hf_checkpoint,
    export_hf_checkpoint=_export_hf_checkpoint,
    generate=generate_t5,
    parallel_generation=False,
)
