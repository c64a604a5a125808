"""BERT checkpoints' ``model_config.json`` (what the tensors cannot tell) and the defaults ``train --load`` takes
from it."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from trainer.checkpoint import MODEL_CONFIG_FILE
from trainer.data import Vocabulary
from trainer.errors import CheckpointError
from trainer.hf_files import read_json, tokenizer_train_defaults, write_json
from trainer.models.bert.model import BertShape

BERT_MODEL = "bert"


def save_model_config(root: str | os.PathLike, shape: BertShape, vocabulary: Vocabulary, hf_model_type: str) -> None:
    """Write a BERT checkpoint root's ``model_config.json`` (call on one rank)."""
    Path(root).mkdir(parents=True, exist_ok=True)
    write_json(Path(root) / MODEL_CONFIG_FILE, {"model": BERT_MODEL, "shape": dataclasses.asdict(shape),
                                                "vocab_size": vocabulary.size, "pad_id": vocabulary.pad_id,
                                                "model_type": hf_model_type})


def read_model_config(root: str | os.PathLike) -> dict:
    """The ``model_config.json`` of a BERT checkpoint root, ``shape`` as a `BertShape`.

    Raises:
        CheckpointError: the file is missing, malformed or not a BERT's.
    """
    path = Path(root) / MODEL_CONFIG_FILE
    value = read_json(path)
    if value.get("model") != BERT_MODEL:
        raise CheckpointError(f"{path}: not a BERT checkpoint (model {value.get('model')!r})")
    try:
        return {**value, "shape": BertShape(**value["shape"]), "vocab_size": int(value["vocab_size"])}
    except (KeyError, TypeError, ValueError) as error:
        raise CheckpointError(f"{path}: malformed model config ({error!r})") from None


def checkpoint_train_defaults(root: str | os.PathLike) -> dict[str, dict]:
    """Defaults that ``train --load ROOT`` takes from a BERT checkpoint: its shape and tokenizer."""
    info = read_model_config(root)
    shape: BertShape = info["shape"]
    return {"model": {"model": BERT_MODEL, "num_layers": shape.num_layers, "hidden_size": shape.hidden_size,
                      "num_attention_heads": shape.num_attention_heads, "ffn_hidden_size": shape.ffn_hidden_size,
                      "max_position_embeddings": shape.max_position_embeddings, "vocab_size": info["vocab_size"],
                      "layernorm_epsilon": shape.layernorm_epsilon},
            "bert": {"bert_no_binary_head": not shape.binary_head},
            **tokenizer_train_defaults(root)}
