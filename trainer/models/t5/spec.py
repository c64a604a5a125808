"""T5 and mT5's `ModelSpec`: what the loop, checkpoints and CLIs ask of the family."""

from __future__ import annotations

from pathlib import Path

import torch
from torch.distributed.device_mesh import DeviceMesh

from trainer.data.batches import Vocabulary
from trainer.checkpoint.store import resolve_checkpoint
from trainer.config import DECODER_OPTION_FIELDS, DEFAULT_DIVISIBLE_BY, DOCUMENT_FIELDS
from trainer.checkpoint.hf_convert import ConvertCheckpointConfig
from trainer.errors import TrainConfigError
from trainer.family.spec import ModelSpec
from trainer.parallel.plan import ParallelPlan
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
from trainer.models.t5.data import T5MicroBatch
from trainer.models.t5.generate import check_t5_generation, generate_t5
from trainer.models.t5.hf import T5_ARCHITECTURES
from trainer.models.t5.model import T5, T5Shape
from trainer.models.t5.parallelize import apply_t5_tp
from trainer.models.t5.pipeline import split_t5_stage
from trainer.models.t5.settings import SECTION, T5Config, t5_stack_layers
from trainer.models.t5.training import layout_rules, training_parts


def _save_model_config(root, shape: T5Shape, vocabulary: Vocabulary, hf_model_type: str) -> None:
    save_t5_model_config(root, shape, vocabulary.size, vocabulary.eod_id, vocabulary.pad_id, hf_model_type)


def _import_hf_checkpoint(config: ConvertCheckpointConfig) -> Path:
    return import_hf_t5_checkpoint(config.from_hf, config.to,
                                   config.make_vocab_size_divisible_by or DEFAULT_DIVISIBLE_BY,
                                   config.tensor_model_parallel_size or 1)


def _export_hf_checkpoint(config: ConvertCheckpointConfig) -> Path:
    root, iteration = resolve_checkpoint(config.from_checkpoint)
    return export_t5_checkpoint(root, iteration, config.to_hf, verify=not config.no_verify)


TIED_WEIGHT_NAME = "shared.weight"
# The last pipeline stage's copy of the shared embedding; only tied variants (v1.0) have one.
TIED_COPY_NAME = "output.weight"
# What a micro-batch feeds `T5.forward` (the first pipeline stage), in order.
MODEL_INPUTS = ("encoder_input_ids", "decoder_input_ids", "encoder_attention_mask")


def _split_stage(model: T5, stage_id: int, num_stages: int) -> T5:
    try:
        return split_t5_stage(model, stage_id, num_stages)
    except ValueError as error:
        raise TrainConfigError(str(error)) from error


def _apply_tp(part: T5, tp_mesh: DeviceMesh, sequence_parallel: bool) -> None:
    try:
        apply_t5_tp(part, tp_mesh, sequence_parallel)
    except ValueError as error:
        raise TrainConfigError(str(error)) from error


def model_inputs(mb: T5MicroBatch) -> tuple[torch.Tensor, ...]:
    """The tensors of a micro-batch `T5.forward` takes, in its order."""
    return tuple(getattr(mb, name) for name in MODEL_INPUTS)


PLAN = ParallelPlan(
    build=T5,
    num_layers=lambda shape: shape.num_encoder_layers + shape.num_decoder_layers,
    split_stage=_split_stage,
    apply_tp=_apply_tp,
    blocks=lambda part: [*part.encoder_layers.values(), *part.decoder_layers.values()],
    tied_names=lambda shape: (TIED_WEIGHT_NAME, TIED_COPY_NAME) if shape.tie_word_embeddings else None,
    model_inputs=model_inputs,
)

SPEC = ModelSpec(
    name=T5_MODEL,
    hf_model_types=tuple(T5_ARCHITECTURES),
    training_parts=training_parts,
    layout_rules=layout_rules,
    parallel_plan=PLAN,
    checkpoint_model=T5,
    vocab_rows=VOCAB_ROWS,
    load_hf_weights=load_hf_t5_weights,
    save_model_config=_save_model_config,
    hf_train_defaults=t5_train_defaults,
    checkpoint_train_defaults=t5_checkpoint_train_defaults,
    import_hf_checkpoint=_import_hf_checkpoint,
    export_hf_checkpoint=_export_hf_checkpoint,
    generate=generate_t5,
    check_generation=check_t5_generation,
    parallel_generation=True,
    # pretrain_t5.py's args_defaults: {"tokenizer_type": "BertWordPieceLowerCase"}.
    default_tokenizer_type="BertWordPieceLowerCase",
    # Lengths are encoder_seq_length/decoder_seq_length; positions are relative buckets (no table, no
    # init std of their own); one dropout_rate (hidden_dropout) serves attention too, as in HF's T5.
    unused_fields=("seq_length", "init_method_std", "attention_dropout", "fused_qkv", *DECODER_OPTION_FIELDS,
                   *DOCUMENT_FIELDS, "mock_data"),
    settings=T5Config,
    sequence_lengths=((SECTION, "encoder_seq_length"), (SECTION, "decoder_seq_length")),
    # Encoder and decoder each count their MoE layers from moe_layer_offset.
    stack_layers=t5_stack_layers,
)
