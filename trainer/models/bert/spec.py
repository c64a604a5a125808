"""BERT's `ModelSpec`: what the loop, checkpoints and CLIs ask of the family (``generate`` does not apply
to an encoder and refuses in one line)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from trainer.checkpoint.store import resolve_checkpoint
from trainer.config import DECODER_OPTION_FIELDS, DEFAULT_DIVISIBLE_BY, DOCUMENT_FIELDS
from trainer.errors import TrainConfigError
from trainer.checkpoint.hf_convert import ConvertCheckpointConfig
from trainer.models.bert.convert import (
    BERT_MODEL,
    HF_MODEL_TYPE,
    checkpoint_train_defaults,
    export_bert_checkpoint,
    hf_bert_train_defaults,
    import_hf_bert_checkpoint,
    load_hf_bert_weights,
    save_model_config,
)
from trainer.models.bert.data import bert_loss, model_inputs, span_loss
from trainer.models.bert.model import PRETRAINING_HEAD, TIED_COPY_NAME, TIED_WEIGHT_NAME, VOCAB_ROWS, Bert
from trainer.models.bert.parallelize import apply_tp
from trainer.models.bert.pipeline import split_stage
from trainer.models.bert.settings import BertConfig
from trainer.models.bert.training import layout_rules, training_parts
from trainer.family.spec import ModelSpec
from trainer.parallel.plan import ParallelPlan

# The model section's head options that only the decoders read (the t5 section's fields are unused too:
# `trainer.models.unused_fields`; the masking section's BERT reads).
DECODER_HEAD_FIELDS = ("kv_channels", "untie_embeddings_and_output_weights")


def _refuse_generation(*_) -> None:
    raise TrainConfigError("generate applies to decoders (gpt, t5); bert is an encoder")


def _import_hf_checkpoint(config: ConvertCheckpointConfig) -> Path:
    return import_hf_bert_checkpoint(config.from_hf, config.to,
                                     config.make_vocab_size_divisible_by or DEFAULT_DIVISIBLE_BY,
                                     config.tensor_model_parallel_size or 1)


def _export_hf_checkpoint(config: ConvertCheckpointConfig) -> Path:
    root, iteration = resolve_checkpoint(config.from_checkpoint)
    return export_bert_checkpoint(root, iteration, config.to_hf, verify=not config.no_verify)


def tied_names(shape) -> tuple[str, str] | None:
    """The word embedding and the MLM decoder's copy of it; None for a model without the MLM head."""
    return (TIED_WEIGHT_NAME, TIED_COPY_NAME) if shape.head == PRETRAINING_HEAD else None


PLAN = ParallelPlan(
    build=Bert,
    num_layers=lambda shape: shape.num_layers,
    split_stage=split_stage,
    apply_tp=apply_tp,
    blocks=lambda part: list(part.layers.values()),
    tied_names=tied_names,
    model_inputs=model_inputs,
    loss=bert_loss,
)

# The same model with the span head (``BertShape(head=SPAN_HEAD)``), fine-tuned for extractive QA
# (`trainer.models.bert.squad`): start/end cross-entropy instead of the pre-training loss.
SPAN_PLAN = dataclasses.replace(PLAN, loss=span_loss)

SPEC = ModelSpec(
    name=BERT_MODEL,
    hf_model_types=(HF_MODEL_TYPE,),
    training_parts=training_parts,
    layout_rules=layout_rules,
    parallel_plan=PLAN,
    checkpoint_model=Bert,
    vocab_rows=VOCAB_ROWS,
    load_hf_weights=load_hf_bert_weights,
    save_model_config=save_model_config,
    hf_train_defaults=hf_bert_train_defaults,
    checkpoint_train_defaults=checkpoint_train_defaults,
    import_hf_checkpoint=_import_hf_checkpoint,
    export_hf_checkpoint=_export_hf_checkpoint,
    generate=_refuse_generation,
    check_generation=_refuse_generation,
    parallel_generation=False,
    # pretrain_bert.py's args_defaults: {"tokenizer_type": "BertWordPieceLowerCase"}.
    default_tokenizer_type="BertWordPieceLowerCase",
    unused_fields=("fused_qkv", *DECODER_OPTION_FIELDS, *DOCUMENT_FIELDS, "mock_data", *DECODER_HEAD_FIELDS),
    settings=BertConfig,
    tasks=(("question_answering", "trainer.models.bert.squad.task"),),
)
