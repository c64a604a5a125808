"""BERT checkpoints' ``model_config.json`` (what the tensors cannot tell), the defaults ``train --load`` takes
from it, and Hugging Face BERT directories in and out (``convert-checkpoint``, ``train --load-hf``).

    import_hf_bert_checkpoint("bert-base-uncased/", "ckpt/bert", 128, 1)   # BertForPreTraining/QA/BertModel
    export_bert_checkpoint("ckpt/run1", "bert-run1/")                       # from_pretrained loads it
    load_hf_bert_weights(model.named_parameters(), "bert-base-uncased/", shape)   # any layout, in place

A directory's ``vocab.txt`` is the WordPiece vocabulary (``BertWordPieceLowerCase`` unless its
``tokenizer_config.json`` says ``do_lower_case: false``); it travels with the checkpoint.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from trainer.checkpoint.load import copy_into_parameter, load_checkpoint
from trainer.checkpoint.save import save_checkpoint
from trainer.checkpoint.store import IMPORTED_ITERATION, LATEST_FILE, MODEL_CONFIG_FILE, MODEL_PREFIX
from trainer.data.batches import Vocabulary
from trainer.errors import CheckpointError
from trainer.checkpoint.model_files import (
    SHAPE_PREFIX,
    Keys,
    check_file_object,
    check_token_id,
    check_transformer_shape,
    check_vocabulary,
)
from trainer.checkpoint.hf_files import (
    copy_tokenizer_files,
    read_hf_config,
    read_hf_weights,
    read_json,
    WORDPIECE_VOCAB,
    tokenizer_train_defaults,
    write_hf_directory,
    write_json,
)
from trainer.models.bert.hf import (
    check_hf_config,
    check_state_shapes,
    hf_config_from_shape,
    hf_head,
    shape_from_hf_config,
    state_from_hf,
    state_to_hf,
)
from trainer.models.bert.model import Bert, BertShape
from trainer.parallel.dims import pad_vocab_size

logger = logging.getLogger(__name__)

BERT_MODEL = "bert"
HF_MODEL_TYPE = "bert"


def save_model_config(root: str | os.PathLike, shape: BertShape, vocabulary: Vocabulary, hf_model_type: str) -> None:
    """Write a BERT checkpoint root's ``model_config.json`` (call on one rank)."""
    Path(root).mkdir(parents=True, exist_ok=True)
    write_json(Path(root) / MODEL_CONFIG_FILE, {"model": BERT_MODEL, "shape": dataclasses.asdict(shape),
                                                "vocab_size": vocabulary.size, "pad_id": vocabulary.pad_id,
                                                "model_type": hf_model_type})


# A BERT checkpoint's model_config.json keys.
MODEL_CONFIG_KEYS = Keys(frozenset({"model", "shape", "vocab_size", "pad_id", "model_type"}),
                         frozenset({"model", "shape", "vocab_size"}))


def read_model_config(root: str | os.PathLike) -> dict:
    """The ``model_config.json`` of a BERT checkpoint root, ``shape`` as a `BertShape`.

    Raises:
        CheckpointError: the file is missing, malformed or not a BERT's.
        ModelFileError: a key the model does not have, a value of the wrong type or range, or a model
            this machine's memory cannot hold (naming the file and the key).
    """
    path = Path(root) / MODEL_CONFIG_FILE
    value = check_file_object(read_json(path), MODEL_CONFIG_KEYS, str(path))
    if value.get("model") != BERT_MODEL:
        raise CheckpointError(f"{path}: not a BERT checkpoint (model {value.get('model')!r})")
    shape = check_transformer_shape(value["shape"], BertShape, str(path))
    check_vocabulary(str(path), value["vocab_size"], shape["padded_vocab_size"], f"{SHAPE_PREFIX}padded_vocab_size")
    check_token_id(str(path), "pad_id", value.get("pad_id"), value["vocab_size"])
    try:
        return {**value, "shape": BertShape(**value["shape"]), "vocab_size": int(value["vocab_size"])}
    except (KeyError, TypeError, ValueError) as error:
        raise CheckpointError(f"{path}: malformed model config ({error!r})") from None


def checkpoint_train_defaults(root: str | os.PathLike) -> dict[str, dict]:
    """Defaults that ``train --load ROOT`` takes from a BERT checkpoint: its shape and tokenizer."""
    info = read_model_config(root)
    return _shape_defaults(info["shape"], info["vocab_size"], root)


def _shape_defaults(shape: BertShape, vocab_size: int, directory: str | os.PathLike) -> dict[str, dict]:
    """The `TrainConfig` fields, by section, that rebuild ``shape`` over ``vocab_size``, and the tokenizer of
    ``directory``."""
    return {"model": {"model": BERT_MODEL, "num_layers": shape.num_layers, "hidden_size": shape.hidden_size,
                      "num_attention_heads": shape.num_attention_heads, "ffn_hidden_size": shape.ffn_hidden_size,
                      "max_position_embeddings": shape.max_position_embeddings, "vocab_size": vocab_size,
                      "layernorm_epsilon": shape.layernorm_epsilon},
            "bert": {"bert_no_binary_head": not shape.binary_head},
            **bert_tokenizer_defaults(directory)}


# The tokenizer_config.json that says whether a HF BERT's vocab.txt is cased.
TOKENIZER_CONFIG = "tokenizer_config.json"


def bert_tokenizer_defaults(directory: str | os.PathLike) -> dict[str, dict]:
    """``{"data": tokenizer options}`` of a directory's ``vocab.txt`` (Megatron's BertWordPiece tokenizer, cased
    as its tokenizer_config.json says; lower case by default, as transformers' BertTokenizer), else of its other
    tokenizer files; {} if it holds none."""
    root = Path(directory)
    if not (root / WORDPIECE_VOCAB).is_file():
        return tokenizer_train_defaults(root)
    lower = True
    if (root / TOKENIZER_CONFIG).is_file():
        lower = read_json(root / TOKENIZER_CONFIG).get("do_lower_case", True) is not False
    kind = "BertWordPieceLowerCase" if lower else "BertWordPieceCase"
    return {"data": {"tokenizer_type": kind, "vocab_file": str(root / WORDPIECE_VOCAB), "merge_file": None,
                     "tokenizer_model": None}}


def _checked_config(hf_dir: str | os.PathLike) -> dict[str, Any]:
    config = read_hf_config(hf_dir)
    check_hf_config(config, str(Path(hf_dir) / "config.json"))
    return config


def hf_shape(hf_dir: str | os.PathLike, padded_vocab_size: int | None = None, head: str | None = None) -> BertShape:
    """Our shape of a HF BERT directory: its config, and its head as its tensors hold it (``head`` overrides).

    Raises:
        HFConversionError: the directory is not a BERT we can reproduce.
    """
    config = _checked_config(hf_dir)
    own_head, binary = hf_head(read_hf_weights(hf_dir))
    return shape_from_hf_config(config, padded_vocab_size, head or own_head, binary)


def hf_bert_train_defaults(hf_dir: str | os.PathLike) -> dict[str, dict]:
    """Defaults that ``train --load-hf DIR`` takes from a HF BERT directory: shape, binary head, tokenizer.

    Raises:
        HFConversionError: the directory is not a BERT we can reproduce.
    """
    config = _checked_config(hf_dir)
    return _shape_defaults(hf_shape(hf_dir), config["vocab_size"], hf_dir)


def _initialised_state(shape: BertShape, seed: int) -> dict[str, torch.Tensor]:
    """Every parameter of ``Bert(shape)`` as its own initialisation draws it from ``seed`` (heads a file lacks)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Bert(shape)
    return {name: p.detach() for name, p in model.named_parameters()}


def hf_bert_state(hf_dir: str | os.PathLike, shape: BertShape) -> tuple[dict[str, torch.Tensor], list[str]]:
    """The parameters of ``Bert(shape)`` a HF BERT directory holds, and the names it lacks (heads).

    Raises:
        HFConversionError: the directory is not a BERT, or its tensors do not fit ``shape``.
    """
    config = _checked_config(hf_dir)
    state, absent = state_from_hf(read_hf_weights(hf_dir), config, shape, str(hf_dir))
    with torch.device("meta"):
        expected = {name: p.shape for name, p in Bert(shape).named_parameters()}
    check_state_shapes(state, expected, shape, str(hf_dir))
    if absent:
        logger.info("%s holds no %s: initialised", hf_dir, ", ".join(absent))
    return state, absent


def import_hf_bert_checkpoint(hf_dir: str | os.PathLike, root: str | os.PathLike, make_vocab_size_divisible_by: int,
                              tensor_model_parallel_size: int, seed: int = 0) -> Path:
    """Convert a HF BERT directory (BertForPreTraining, BertForMaskedLM, BertForQuestionAnswering or BertModel)
    into a model-only checkpoint at iteration 0; heads the directory lacks (a BertModel's) are initialised
    from ``seed``.

    Raises:
        HFConversionError: the directory is not a BERT we can reproduce.
        CheckpointError: ``root`` already holds a checkpoint.
    """
    if (Path(root) / LATEST_FILE).exists():
        raise CheckpointError(f"{root} already holds a checkpoint; convert into a new directory")
    config = _checked_config(hf_dir)
    padded = pad_vocab_size(config["vocab_size"], make_vocab_size_divisible_by, tensor_model_parallel_size)
    shape = hf_shape(hf_dir, padded)
    state, absent = hf_bert_state(hf_dir, shape)
    if absent:
        initial = _initialised_state(shape, seed)
        state |= {name: initial[name] for name in absent}
    Path(root).mkdir(parents=True, exist_ok=True)
    copy_tokenizer_files(hf_dir, root)
    save_model_config(root, shape, Vocabulary(size=config["vocab_size"], eod_id=None,
                                              pad_id=config.get("pad_token_id", 0)), HF_MODEL_TYPE)
    # The pointer file, written last by save_checkpoint, is what makes the root a valid checkpoint.
    return save_checkpoint(root, IMPORTED_ITERATION, {MODEL_PREFIX + name: t for name, t in state.items()})


def read_bert_checkpoint(root: Path, iteration: int, verify: bool = True) -> tuple[dict[str, torch.Tensor], dict]:
    """The full parameters of a BERT checkpoint (resharded from any saved layout) and its `read_model_config`.

    Raises:
        CheckpointError: not a BERT checkpoint, or its tensors do not fit its model config.
    """
    info = read_model_config(root)
    with torch.device("meta"):
        names = {name: p.shape for name, p in Bert(info["shape"]).named_parameters()}
    state = {MODEL_PREFIX + name: torch.empty(size) for name, size in names.items()}
    load_checkpoint(root, iteration, state, verify=verify)
    return {name.removeprefix(MODEL_PREFIX): t for name, t in state.items()}, info


def export_bert_checkpoint(root: Path, iteration: int, hf_dir: str | os.PathLike, verify: bool = True) -> Path:
    """Write a BERT checkpoint as a HF directory: BertForPreTraining (BertForMaskedLM without the binary head)
    or BertForQuestionAnswering, padded vocabulary rows dropped, tokenizer files copied."""
    state, info = read_bert_checkpoint(root, iteration, verify)
    shape: BertShape = info["shape"]
    config = hf_config_from_shape(shape, info["vocab_size"], info.get("pad_id"))
    return write_hf_directory(hf_dir, config, state_to_hf(state, shape, info["vocab_size"]), tokenizer_source=root)


def load_hf_bert_weights(named_parameters: list[tuple[str, nn.Parameter]], hf_dir: str | os.PathLike,
                         shape: BertShape) -> str:
    """Fill a BERT's parameters with HF BERT weights in place, in any tp/pp/dp layout; parameters the directory
    lacks (a span head over a pre-trained BERT, the heads of a BertModel) keep their initialisation.

    Args:
        named_parameters: this rank's parameters under full-model names (the last pipeline stage's MLM
            decoder copy named ``lm_head.decoder.weight``), plain tensors or DTensors (TP, FSDP2).
        hf_dir: local HF BERT directory.
        shape: the run's shape; its vocabulary may be padded beyond the directory's.

    Returns:
        The HF model type to record.

    Raises:
        HFConversionError: the directory is not a BERT.
        CheckpointError: its dimensions differ from ``shape``.
    """
    config = _checked_config(hf_dir)
    theirs = shape_from_hf_config(config, shape.padded_vocab_size, shape.head, shape.binary_head)
    for field in ("num_layers", "hidden_size", "num_attention_heads", "ffn_hidden_size", "max_position_embeddings",
                  "layernorm_epsilon"):
        if getattr(theirs, field) != getattr(shape, field):
            raise CheckpointError(f"{Path(hf_dir) / 'config.json'}: the model has {field} {getattr(theirs, field)} "
                                  f"but the run asks for {getattr(shape, field)}")
    state, _ = hf_bert_state(hf_dir, shape)
    # The MLM decoder (a pipeline stage's copy of the tied embedding) is the word embedding.
    if "word_embeddings.weight" in state:
        state["lm_head.decoder.weight"] = state["word_embeddings.weight"]
    for name, param in named_parameters:
        if name in state:
            copy_into_parameter(param, state[name])
    logger.info("loaded Hugging Face weights from %s", hf_dir)
    return HF_MODEL_TYPE
