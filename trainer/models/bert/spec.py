"""BERT's `ModelSpec`: what the loop, checkpoints and CLIs ask of the family.

Not yet implemented, each refused with one line naming it: Hugging Face import and export
(``train --load-hf``, ``convert-checkpoint``); ``generate`` does not apply to an encoder.
"""

from __future__ import annotations

from trainer.errors import TrainConfigError
from trainer.models.bert.convert import BERT_MODEL, checkpoint_train_defaults, save_model_config
from trainer.models.bert.data import bert_loss, model_inputs
from trainer.models.bert.model import TIED_COPY_NAME, TIED_WEIGHT_NAME, VOCAB_ROWS, Bert
from trainer.models.bert.parallelize import apply_fsdp, apply_tp
from trainer.models.bert.pipeline import split_stage
from trainer.models.bert.training import layout_rules, training_parts
from trainer.models.spec import ModelSpec, ParallelPlan

HF_MODEL_TYPE = "bert"
HF_NOT_IMPLEMENTED = "Hugging Face BERT import and export are not implemented yet for model bert"


def _refuse_hf(*_) -> None:
    raise TrainConfigError(HF_NOT_IMPLEMENTED)


def _refuse_generation(*_) -> None:
    raise TrainConfigError("generate applies to decoders (gpt, t5); bert is an encoder")


PLAN = ParallelPlan(
    build=Bert,
    num_layers=lambda shape: shape.num_layers,
    split_stage=split_stage,
    apply_tp=apply_tp,
    apply_fsdp=apply_fsdp,
    blocks=lambda part: list(part.layers.values()),
    tied_names=lambda shape: (TIED_WEIGHT_NAME, TIED_COPY_NAME),
    model_inputs=model_inputs,
    loss=bert_loss,
)

SPEC = ModelSpec(
    name=BERT_MODEL,
    hf_model_types=(HF_MODEL_TYPE,),
    training_parts=training_parts,
    layout_rules=layout_rules,
    parallel_plan=PLAN,
    checkpoint_model=Bert,
    vocab_rows=VOCAB_ROWS,
    load_hf_weights=_refuse_hf,
    save_model_config=save_model_config,
    hf_train_defaults=_refuse_hf,
    checkpoint_train_defaults=checkpoint_train_defaults,
    import_hf_checkpoint=_refuse_hf,
    export_hf_checkpoint=_refuse_hf,
    generate=_refuse_generation,
    check_generation=_refuse_generation,
    parallel_generation=False,
)
