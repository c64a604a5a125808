"""Hugging Face T5/mT5 directories <-> tokenmill T5 checkpoints (what ``convert-checkpoint`` does for T5).

A T5 checkpoint is the trainer's DCP layout; beside it, ``model_config.json`` records ``"model": "t5"``,
the shape (vocabulary padded as the train run pads it), the real vocabulary size, the EOS and pad ids
and the HF ``model_type`` (t5 or mt5). ``train --model t5`` writes it too, so its checkpoints export
without extra flags.

    import_hf_t5_checkpoint("t5-small/", "checkpoints/t5-small")     # then: train --model t5 --load ...
    export_t5_checkpoint("checkpoints/run1", "t5-run1/")             # loads with T5ForConditionalGeneration
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import torch

from trainer.checkpoint import (
    IMPORTED_ITERATION,
    LATEST_FILE,
    MODEL_CONFIG_FILE,
    MODEL_PREFIX,
    load_checkpoint,
    save_checkpoint,
)
from trainer.errors import CheckpointError
from trainer.hf_files import copy_tokenizer_files, read_hf_config, read_json, write_json
from trainer.hf_t5 import load_hf_t5, save_hf_t5
from trainer.parallel_dims import pad_vocab_size
from trainer.t5_model import T5, T5Shape

T5_MODEL = "t5"
# The vocabulary rows: the shared embedding and an untied head.
VOCAB_ROWS = ("shared.weight", "output.weight")


def save_t5_model_config(root: str | os.PathLike, shape: T5Shape, vocab_size: int, eos_id: int, pad_id: int,
                         model_type: str) -> None:
    """Write a T5 checkpoint root's ``model_config.json`` (call on one rank)."""
    Path(root).mkdir(parents=True, exist_ok=True)
    write_json(Path(root) / MODEL_CONFIG_FILE, {"model": T5_MODEL, "shape": dataclasses.asdict(shape),
                                                "vocab_size": vocab_size, "eos_id": eos_id, "pad_id": pad_id,
                                                "model_type": model_type})


def read_t5_model_config(root: str | os.PathLike) -> dict | None:
    """The ``model_config.json`` of a T5 checkpoint root (``shape`` as a `T5Shape`); None for any other root.

    Raises:
        CheckpointError: the file is malformed.
    """
    path = Path(root) / MODEL_CONFIG_FILE
    if not path.is_file():
        return None
    value = read_json(path)
    if value.get("model") != T5_MODEL:
        return None
    try:
        return {**value, "shape": T5Shape(**value["shape"]), "vocab_size": int(value["vocab_size"])}
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
        tensor = param.detach()
        if name in VOCAB_ROWS:
            tensor = torch.cat([tensor, tensor.new_zeros(padded - vocab_size, tensor.shape[1])])
        state[MODEL_PREFIX + name] = tensor.contiguous()
    Path(root).mkdir(parents=True, exist_ok=True)
    copy_tokenizer_files(hf_dir, root)
    save_t5_model_config(root, dataclasses.replace(model.shape, vocab_size=padded), vocab_size,
                         config.get("eos_token_id", 1), config.get("pad_token_id", 0), config["model_type"])
    return save_checkpoint(root, IMPORTED_ITERATION, state)


def export_t5_checkpoint(root: Path, iteration: int, hf_dir: str | os.PathLike) -> Path:
    """Write iteration ``iteration`` of a T5 checkpoint root as a HF T5/mT5 directory (padding rows dropped).

    Raises:
        CheckpointError: the root is not a T5 checkpoint, or its tensors do not fit its model config.
    """
    info = read_t5_model_config(root)
    if info is None:
        raise CheckpointError(f"{root} has no T5 {MODEL_CONFIG_FILE}")
    with torch.device("meta"):
        names = {name: p.shape for name, p in T5(info["shape"]).named_parameters()}
    state = {MODEL_PREFIX + name: torch.empty(shape) for name, shape in names.items()}
    load_checkpoint(root, iteration, state)
    vocab_size = info["vocab_size"]
    model = T5(dataclasses.replace(info["shape"], vocab_size=vocab_size))
    trimmed = {name.removeprefix(MODEL_PREFIX): (t[:vocab_size] if name.removeprefix(MODEL_PREFIX) in VOCAB_ROWS
                                                 else t) for name, t in state.items()}
    model.load_state_dict(trimmed, strict=False)
    model.tie_weights()
    return save_hf_t5(model, hf_dir, info["model_type"], info["eos_id"], info["pad_id"], tokenizer_source=root)
