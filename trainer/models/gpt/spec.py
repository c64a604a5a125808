"""GPT's `ModelSpec`: what the loop, checkpoints and CLIs ask of the family."""

from __future__ import annotations

from pathlib import Path

from trainer.data import Vocabulary
from trainer.generate import generate
from trainer.hf_convert import (
    DEFAULT_DIVISIBLE_BY,
    CheckpointModel,
    ConvertCheckpointConfig,
    export_hf_checkpoint,
    gpt_checkpoint_train_defaults,
    hf_train_defaults,
    import_hf_checkpoint,
    load_hf_weights,
    save_model_config,
)
from trainer.models.gpt.model import GPT, GPTShape
from trainer.models.gpt.training import training_parts
from trainer.models.spec import ModelSpec
from trainer.runner import TIED_WEIGHT_NAME, ParallelModel

HF_MODEL_TYPE = "gpt2"


def _load_hf_weights(named_parameters, hf_dir, shape: GPTShape) -> str:
    load_hf_weights(named_parameters, hf_dir, shape)
    return HF_MODEL_TYPE


def _save_model_config(root, shape: GPTShape, vocabulary: Vocabulary, hf_model_type: str) -> None:
    save_model_config(root, CheckpointModel(shape, vocabulary.size, vocabulary.eod_id))


def _import_hf_checkpoint(config: ConvertCheckpointConfig) -> Path:
    return import_hf_checkpoint(config.from_hf, config.to, config.make_vocab_size_divisible_by or DEFAULT_DIVISIBLE_BY,
                                config.tensor_model_parallel_size or 1)


def _export_hf_checkpoint(config: ConvertCheckpointConfig) -> Path:
    return export_hf_checkpoint(config.from_checkpoint, config.to_hf, config.num_attention_heads, config.vocab_size,
                                verify=not config.no_verify)


SPEC = ModelSpec(
    name="gpt",
    hf_model_types=(HF_MODEL_TYPE,),
    training_parts=training_parts,
    parallel_model=ParallelModel,
    # Checkpoints hold q, k and v apart whether or not a run fuses them (`fused_qkv`).
    checkpoint_model=lambda shape: GPT(shape.unfused()),
    vocab_rows=(TIED_WEIGHT_NAME, "output.weight"),
    load_hf_weights=_load_hf_weights,
    save_model_config=_save_model_config,
    hf_train_defaults=hf_train_defaults,
    checkpoint_train_defaults=gpt_checkpoint_train_defaults,
    import_hf_checkpoint=_import_hf_checkpoint,
    export_hf_checkpoint=_export_hf_checkpoint,
    generate=generate,
    parallel_generation=True,
)
