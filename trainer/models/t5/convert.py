"""Hugging Face T5/mT5 directories <-> tokenmill T5 checkpoints (what ``convert-checkpoint`` does for T5).

A T5 checkpoint is the trainer's DCP layout; beside it, ``model_config.json`` records ``"model": "t5"``,
the shape (vocabulary padded as the train run pads it), the real vocabulary size, the EOS and pad ids
and the HF ``model_type`` (t5 or mt5). ``train --model t5`` writes it too, so its checkpoints export
without extra flags.

    import_hf_t5_checkpoint("t5-small/", "checkpoints/t5-small")     # then: train --model t5 --load ...
    export_t5_checkpoint("checkpoints/run1", "t5-run1/")             # loads with T5ForConditionalGeneration
    load_hf_t5_weights(model.named_parameters(), "t5-small/", shape)  # train --load-hf: any layout, in place
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import torch
from torch import nn

from trainer.checkpoint.load import copy_into_parameter, load_checkpoint
from trainer.checkpoint.save import save_checkpoint
from trainer.checkpoint.store import IMPORTED_ITERATION, LATEST_FILE, MODEL_CONFIG_FILE, MODEL_PREFIX
from trainer.errors import CheckpointError
from trainer.checkpoint.model_files import (
    MOE_EXPERTS,
    SHAPE_PREFIX,
    Keys,
    check_file_object,
    check_moe_object,
    check_token_id,
    check_vocabulary,
    dataclass_keys,
)
from trainer.checkpoint.hf_files import (
    copy_tokenizer_files,
    read_hf_config,
    read_json,
    tokenizer_train_defaults,
    write_json,
)
from trainer.models.t5.hf import check_t5_values, load_hf_t5, save_hf_t5
from trainer.parallel.dims import pad_vocab_size
from trainer.models.t5.model import T5, T5Shape
from trainer.models.t5.switch import SWITCH_MODEL_TYPE
from trainer.moe.settings import expert_layout, moe_config_fields, moe_settings_from_json

T5_MODEL = "t5"
# The vocabulary rows: the shared embedding and the head (untied, or a pipeline stage's tied copy).
VOCAB_ROWS = ("shared.weight", "output.weight")
# What `train --load-hf` requires of the run's shape besides the (padded) vocabulary.
_LOADED_SHAPE_FIELDS = ("d_model", "d_kv", "d_ff", "num_heads", "num_encoder_layers", "num_decoder_layers",
                        "feed_forward", "tie_word_embeddings", "scale_decoder_outputs",
                        "relative_attention_num_buckets", "relative_attention_max_distance", "layer_norm_epsilon")


def _pad_rows(tensor: torch.Tensor, rows: int) -> torch.Tensor:
    """``tensor`` with zero rows appended up to ``rows`` (the padded vocabulary, as ``train`` pads it)."""
    return torch.cat([tensor, tensor.new_zeros(rows - tensor.shape[0], *tensor.shape[1:])])


def save_t5_model_config(root: str | os.PathLike, shape: T5Shape, vocab_size: int, eos_id: int, pad_id: int,
                         model_type: str) -> None:
    """Write a T5 checkpoint root's ``model_config.json`` (call on one rank). A T5 with experts records
    model_type switch_transformers whatever ``model_type`` says: that is what it exports as."""
    if shape.moe is not None:
        model_type = SWITCH_MODEL_TYPE
    Path(root).mkdir(parents=True, exist_ok=True)
    write_json(Path(root) / MODEL_CONFIG_FILE, {"model": T5_MODEL, "shape": dataclasses.asdict(shape),
                                                "vocab_size": vocab_size, "eos_id": eos_id, "pad_id": pad_id,
                                                "model_type": model_type})


# A T5 checkpoint's model_config.json keys.
T5_MODEL_CONFIG_KEYS = Keys(frozenset({"model", "shape", "vocab_size", "eos_id", "pad_id", "model_type"}),
                            frozenset({"model", "shape", "vocab_size"}))


def read_t5_model_config(root: str | os.PathLike) -> dict | None:
    """The ``model_config.json`` of a T5 checkpoint root (``shape`` as a `T5Shape`); None for any other root.

    Raises:
        CheckpointError: the file is malformed.
        ModelFileError: a key the model does not have, a value of the wrong type or range, or a model
            this machine's memory cannot hold (naming the file and the key).
    """
    path = Path(root) / MODEL_CONFIG_FILE
    if not path.is_file():
        return None
    value = check_file_object(read_json(path), T5_MODEL_CONFIG_KEYS, str(path))
    if value.get("model") != T5_MODEL:
        return None
    shape = check_file_object(value["shape"], dataclass_keys(T5Shape), str(path), SHAPE_PREFIX)
    experts = check_moe_object(shape.get("moe"), str(path), f"{SHAPE_PREFIX}moe.")
    check_t5_values({**shape, MOE_EXPERTS: experts}, str(path), "num_encoder_layers", MOE_EXPERTS, SHAPE_PREFIX)
    check_vocabulary(str(path), value["vocab_size"], shape["vocab_size"], f"{SHAPE_PREFIX}vocab_size")
    for key in ("eos_id", "pad_id"):
        check_token_id(str(path), key, value.get(key), value["vocab_size"])
    try:
        shape = T5Shape(**{**value["shape"], "moe": moe_settings_from_json(value["shape"].get("moe"))})
        return {**value, "shape": shape, "vocab_size": int(value["vocab_size"])}
    except (KeyError, TypeError, ValueError) as error:
        raise CheckpointError(f"{path}: malformed model config ({error!r})") from None


def import_hf_t5_checkpoint(hf_dir: str | os.PathLike, root: str | os.PathLike, make_vocab_size_divisible_by: int,
                            tensor_model_parallel_size: int) -> Path:
    """Convert a HF T5/mT5 directory into a model-only T5 checkpoint at iteration 0.

    The vocabulary rows are padded with zeros as ``train`` pads them (a multiple of
    ``make_vocab_size_divisible_by`` x ``tensor_model_parallel_size``).

    Raises:
        HFConversionError: the directory is not a T5/mT5.
        CheckpointError: ``root`` already holds a checkpoint.
    """
    if (Path(root) / LATEST_FILE).exists():
        raise CheckpointError(f"{root} already holds a checkpoint; convert into a new directory")
    config = read_hf_config(hf_dir)
    model = load_hf_t5(hf_dir)
    vocab_size = model.shape.vocab_size
    padded = pad_vocab_size(vocab_size, make_vocab_size_divisible_by, tensor_model_parallel_size)
    state = {}
    for name, param in model.named_parameters():
        tensor = _pad_rows(param.detach(), padded) if name in VOCAB_ROWS else param.detach()
        state[MODEL_PREFIX + name] = tensor.contiguous()
    Path(root).mkdir(parents=True, exist_ok=True)
    copy_tokenizer_files(hf_dir, root)
    save_t5_model_config(root, dataclasses.replace(model.shape, vocab_size=padded), vocab_size,
                         config.get("eos_token_id", 1), config.get("pad_token_id", 0), config["model_type"])
    return save_checkpoint(root, IMPORTED_ITERATION, state)


def load_t5_checkpoint(root: Path, iteration: int, verify: bool = True) -> tuple[T5, dict]:
    """The `T5` of iteration ``iteration`` of a T5 checkpoint root (padding rows dropped), and its
    `read_t5_model_config`.

    Raises:
        CheckpointError: the root is not a T5 checkpoint, or its tensors do not fit its model config.
    """
    info = read_t5_model_config(root)
    if info is None:
        raise CheckpointError(f"{root} has no T5 {MODEL_CONFIG_FILE}")
    with torch.device("meta"):
        names = {name: p.shape for name, p in T5(info["shape"]).named_parameters()}
    state = {MODEL_PREFIX + name: torch.empty(shape) for name, shape in names.items()}
    load_checkpoint(root, iteration, state, verify=verify)
    vocab_size = info["vocab_size"]
    model = T5(dataclasses.replace(info["shape"], vocab_size=vocab_size))
    trimmed = {name.removeprefix(MODEL_PREFIX): (t[:vocab_size] if name.removeprefix(MODEL_PREFIX) in VOCAB_ROWS
                                                 else t) for name, t in state.items()}
    model.load_state_dict(trimmed, strict=False)
    model.tie_weights()
    return model, info


def export_t5_checkpoint(root: Path, iteration: int, hf_dir: str | os.PathLike, verify: bool = True) -> Path:
    """Write iteration ``iteration`` of a T5 checkpoint root as a HF T5/mT5 directory (padding rows dropped).

    Raises:
        CheckpointError: the root is not a T5 checkpoint, or its tensors do not fit its model config.
    """
    model, info = load_t5_checkpoint(root, iteration, verify)
    return save_hf_t5(model, hf_dir, info["model_type"], info["eos_id"], info["pad_id"], tokenizer_source=root)


def t5_train_defaults(hf_dir: str | os.PathLike) -> dict[str, dict]:
    """Defaults that ``train --load-hf DIR`` takes from a HF T5/mT5 directory, by `TrainConfig` section.

    ``model``: ``model="t5"``, the widths, layers, heads, d_kv, head tying, epsilon and vocabulary size;
    ``t5``: the decoder layers, the MLP kind, the decoder output scaling and the relative position buckets; ``data``: the
    tokenizer files stored in DIR (absent when there are none). Flags the user gives still win;
    `load_hf_t5_weights` then rejects a shape the weights do not fit.

    Raises:
        HFConversionError: the directory is not a T5/mT5.
    """
    shape = load_hf_t5(hf_dir).shape
    return {**t5_shape_defaults(shape, shape.vocab_size), **tokenizer_train_defaults(hf_dir)}


def t5_checkpoint_train_defaults(root: str | os.PathLike) -> dict[str, dict]:
    """Defaults that ``train --load ROOT`` takes from a T5 checkpoint: its model_config.json and tokenizer."""
    info = read_t5_model_config(root)
    return {**t5_shape_defaults(info["shape"], info["vocab_size"]), **tokenizer_train_defaults(root)}


def t5_shape_defaults(shape: T5Shape, vocab_size: int) -> dict[str, dict]:
    """The `TrainConfig` fields, by section, that rebuild ``shape`` over a real vocabulary of ``vocab_size``."""
    return {
        "moe": moe_config_fields(shape.moe),
        "model": {"model": T5_MODEL, "num_layers": shape.num_encoder_layers, "hidden_size": shape.d_model,
                  "num_attention_heads": shape.num_heads, "ffn_hidden_size": shape.d_ff,
                  "vocab_size": vocab_size, "layernorm_epsilon": shape.layer_norm_epsilon,
                  "kv_channels": shape.d_kv, "untie_embeddings_and_output_weights": not shape.tie_word_embeddings},
        "t5": {"decoder_num_layers": shape.num_decoder_layers, "feed_forward_proj": shape.feed_forward,
               "scale_decoder_outputs": shape.scale_decoder_outputs,
               "relative_attention_num_buckets": shape.relative_attention_num_buckets,
               "relative_attention_max_distance": shape.relative_attention_max_distance},
    }


def load_hf_t5_weights(named_parameters: list[tuple[str, nn.Parameter]], hf_dir: str | os.PathLike,
                       shape: T5Shape) -> str:
    """Fill a T5's parameters with HF T5/mT5 weights in place, in any tp/pp/dp layout.

    Args:
        named_parameters: this rank's parameters under full-model names (the last pipeline stage's copy
            of a tied head named ``output.weight``), plain tensors or DTensors (TP, FSDP2).
        hf_dir: local HF T5/mT5 directory.
        shape: the run's shape; its vocabulary may be padded beyond the directory's.

    Returns:
        The directory's ``model_type`` (t5 or mt5).

    Raises:
        HFConversionError: the directory is not a T5/mT5.
        CheckpointError: its shape differs from ``shape``.
    """
    model = load_hf_t5(hf_dir)
    source = str(Path(hf_dir) / "config.json")
    for field in _LOADED_SHAPE_FIELDS:
        theirs, ours = getattr(model.shape, field), getattr(shape, field)
        if theirs != ours:
            raise CheckpointError(f"{source}: the model has {field} {theirs} but the run asks for {ours}")
    if (model.shape.moe is None) != (shape.moe is None) or (
            shape.moe is not None and not shape.moe.same_parameters(model.shape.moe)):
        raise CheckpointError(f"{source}: the model has experts {expert_layout(model.shape.moe)} but the run "
                              f"asks for {expert_layout(shape.moe)}")
    if model.shape.vocab_size > shape.vocab_size:
        raise CheckpointError(f"{source}: the model has vocab_size {model.shape.vocab_size} but the run's "
                              f"(padded) vocabulary has {shape.vocab_size}")
    # With duplicates: a tied head is listed as output.weight too, the name of its pipeline-stage copy.
    state = dict(model.named_parameters(remove_duplicate=False))
    for name, param in named_parameters:
        full = state[name].detach()
        copy_into_parameter(param, _pad_rows(full, shape.vocab_size) if name in VOCAB_ROWS else full)
    return read_hf_config(hf_dir)["model_type"]
