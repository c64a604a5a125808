"""GPT's `ModelSpec`: what the loop, checkpoints and CLIs ask of the family."""

from __future__ import annotations

from pathlib import Path

import torch

from trainer.data.batches import Vocabulary
from trainer.config import DEFAULT_DIVISIBLE_BY, MaskingConfig
from trainer.checkpoint.hf_convert import ConvertCheckpointConfig
from trainer.models.gpt.convert import (
    CheckpointModel,
    export_hf_checkpoint,
    gpt_checkpoint_train_defaults,
    hf_train_defaults,
    import_hf_checkpoint,
    load_hf_weights,
    save_model_config,
)
from trainer.models.gpt.hf_decoders import GPT_HF_MODEL_TYPES
from trainer.models.gpt.fused_qkv import from_checkpoint, to_checkpoint
from trainer.models.gpt.generate import check_gpt_generation, generate_gpt, resolve_gpt_source
from trainer.models.gpt.model import GPT, TIED_COPY_NAME, TIED_WEIGHT_NAME, GPTShape
from trainer.models.gpt.parallelize import apply_tp
from trainer.models.gpt.pipeline import split_stage
from trainer.models.gpt.training import layout_rules, training_parts
from trainer.family.spec import ModelSpec, section_fields
from trainer.parallel.plan import ParallelPlan

def _load_hf_weights(named_parameters, hf_dir, shape: GPTShape) -> str:
    return load_hf_weights(named_parameters, hf_dir, shape)["model_type"]


def _save_model_config(root, shape: GPTShape, vocabulary: Vocabulary, hf_model_type: str) -> None:
    save_model_config(root, CheckpointModel(shape, vocabulary.size, vocabulary.eod_id, hf_model_type))


def _import_hf_checkpoint(config: ConvertCheckpointConfig) -> Path:
    return import_hf_checkpoint(config.from_hf, config.to, config.make_vocab_size_divisible_by or DEFAULT_DIVISIBLE_BY,
                                config.tensor_model_parallel_size or 1)


def _export_hf_checkpoint(config: ConvertCheckpointConfig) -> Path:
    return export_hf_checkpoint(config.from_checkpoint, config.to_hf, config.num_attention_heads, config.vocab_size,
                                verify=not config.no_verify)


def _to_checkpoint(state: dict[str, torch.Tensor], shape: GPTShape) -> dict[str, torch.Tensor]:
    return to_checkpoint(state, shape.num_attention_heads, shape.query_groups) if shape.fused_qkv else state


def _from_checkpoint(loaded: dict[str, torch.Tensor], state: dict[str, torch.Tensor], shape: GPTShape) -> None:
    from_checkpoint(loaded, state, shape.num_attention_heads, shape.query_groups)


PLAN = ParallelPlan(
    build=GPT,
    num_layers=lambda shape: shape.num_layers,
    split_stage=split_stage,
    apply_tp=apply_tp,
    blocks=lambda part: list(part.layers.values()),
    tied_names=lambda shape: (TIED_WEIGHT_NAME, TIED_COPY_NAME) if shape.tied else None,
    model_inputs=lambda mb: (mb.tokens, mb.position_ids),
    model_kwargs=lambda mb: {} if mb.attention_mask is None else {"attention_mask": mb.attention_mask},
    # Checkpoints hold q, k and v apart whether or not a run fuses them (`fused_qkv`).
    to_checkpoint=_to_checkpoint,
    from_checkpoint=_from_checkpoint,
)

SPEC = ModelSpec(
    name="gpt",
    hf_model_types=GPT_HF_MODEL_TYPES,
    training_parts=training_parts,
    layout_rules=layout_rules,
    parallel_plan=PLAN,
    # Checkpoints hold q, k and v apart whether or not a run fuses them (`fused_qkv`).
    checkpoint_model=lambda shape: GPT(shape.unfused()),
    vocab_rows=(TIED_WEIGHT_NAME, TIED_COPY_NAME),
    load_hf_weights=_load_hf_weights,
    save_model_config=_save_model_config,
    hf_train_defaults=hf_train_defaults,
    checkpoint_train_defaults=gpt_checkpoint_train_defaults,
    import_hf_checkpoint=_import_hf_checkpoint,
    export_hf_checkpoint=_export_hf_checkpoint,
    generate=generate_gpt,
    check_generation=check_gpt_generation,
    parallel_generation=True,
    scoring_source=resolve_gpt_source,
    # GPT samples are token windows: nothing masked (the other families' sections: `trainer.models.unused_fields`).
    unused_fields=section_fields(MaskingConfig),
    fused_qkv=True,
    plain_bin_reads=True,
    tasks=(("text_generation", "trainer.models.gpt.task"),),
)
