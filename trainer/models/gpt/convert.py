"""Hugging Face GPT-2 and Llama-class directories (`trainer.models.gpt.hf_decoders`) <-> tokenmill GPT
checkpoints, and HF weights into a (parallel) GPT.

A converted checkpoint is the trainer's DCP layout (`trainer.checkpoint.store`) with the model only, at
iteration 0, so ``train --load`` starts from it in any tp/pp/dp layout. Beside it, in the checkpoint
root, ``model_config.json`` records the shape, the real vocabulary size and the EOD id (what export
and ``generate`` need and tensors cannot tell: the head count, the padding; for a Llama-class import
also its ``model_type``, so that a Mistral is exported as a Mistral), and the HF tokenizer files are
copied there.

    import_hf_checkpoint("gpt2/", "checkpoints/gpt2")               # convert-checkpoint --from-hf ... --to ...
    export_hf_checkpoint("checkpoints/run1", "gpt2-finetuned/")      # convert-checkpoint --from ... --to-hf ...
    load_hf_weights(model.named_parameters(), "gpt2/", shape)        # train --load-hf: any layout, in place
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from trainer.checkpoint.load import SafeFileSystemReader, copy_into_parameter, load_checkpoint
from trainer.checkpoint.save import save_checkpoint
from trainer.checkpoint.store import (
    IMPORTED_ITERATION,
    LATEST_FILE,
    MODEL_CONFIG_FILE,
    MODEL_PREFIX,
    checkpoint_dir,
    resolve_checkpoint,
)
from trainer.errors import CheckpointError, HFConversionError, ModelFileError
from trainer.checkpoint.hf_files import (
    copy_tokenizer_files,
    read_hf_config,
    read_hf_weights,
    read_json,
    tokenizer_train_defaults,
    write_hf_directory,
    write_json,
)
from trainer.models.gpt.hf_decoders import (
    GPT_HF_MODEL_TYPES,
    check_decoder_config,
    hf_eos_id,
    decoder_shape,
    decoder_state,
    export_decoder,
    is_gpt2_shape,
    is_llama_config,
)
from trainer.models.gpt.hf_llama import check_flag_expressible
from trainer.models.gpt.model import DECODER_OPTIONS, GPT, GPTShape
from trainer.config import DEFAULT_DIVISIBLE_BY
from trainer.checkpoint.model_files import (
    SHAPE_PREFIX,
    Keys,
    check_file_object,
    check_token_id,
    check_transformer_shape,
    check_vocabulary,
)
from trainer.moe.settings import expert_layout, moe_config_fields, moe_settings_from_json
from trainer.parallel.dims import pad_vocab_size

logger = logging.getLogger(__name__)

# `GPTShape`'s Llama-class option fields and their GPT-2 values.
DECODER_OPTION_DEFAULTS = {f.name: f.default for f in dataclasses.fields(GPTShape) if f.name in DECODER_OPTIONS}

@dataclass(frozen=True, slots=True)
class CheckpointModel:
    """What a checkpoint's tensors do not tell about its model."""

    shape: GPTShape
    vocab_size: int
    """Real (unpadded) vocabulary size."""
    eod_id: int | None
    hf_model_type: str | None = None
    """The Hugging Face ``model_type`` it was imported from (a Llama-class one; None: GPT-2 or unknown)."""


# model_config.json's keys (``eod_id`` may be absent: older checkpoints; ``model_type`` only after a
# Llama-class import).
MODEL_CONFIG_KEYS = Keys(frozenset({"model", "shape", "vocab_size", "eod_id", "model_type"}),
                         frozenset({"shape", "vocab_size"}))


def save_model_config(root: str | os.PathLike, model: CheckpointModel) -> None:
    """Write ``model_config.json`` into a checkpoint root (call on one rank)."""
    Path(root).mkdir(parents=True, exist_ok=True)
    # The checkpoint's tensors are unfused whatever the run computed with (`trainer.models.gpt.fused_qkv`), so the
    # fusion switch is the saving run's, not the checkpoint's: it is left out.
    # The Llama-class options are written only where they differ from GPT-2 (every option off): a GPT-2
    # checkpoint's file stays byte for byte what it was, and reading fills the defaults back in.
    shape = {name: value for name, value in dataclasses.asdict(model.shape).items()
             if name != "fused_qkv" and not _default_option(name, value)}
    recorded = {"model_type": model.hf_model_type} if model.hf_model_type not in (None, GPT_HF_MODEL_TYPES[0]) else {}
    write_json(Path(root) / MODEL_CONFIG_FILE, {"shape": shape,
                                                "vocab_size": model.vocab_size, "eod_id": model.eod_id, **recorded})


def _default_option(name: str, value: Any) -> bool:
    """Whether ``name`` is a Llama-class option of the shape at its GPT-2 value (left out of model_config.json)."""
    return name in DECODER_OPTION_DEFAULTS and value == DECODER_OPTION_DEFAULTS[name]


def read_model_config(root: str | os.PathLike) -> CheckpointModel | None:
    """The ``model_config.json`` of a checkpoint root, or None when it has none.

    Raises:
        CheckpointError: the file exists but is malformed.
        ModelFileError: a key the model does not have, a value of the wrong type or range, or a model
            this machine's memory cannot hold (naming the file and the key).
    """
    path = Path(root) / MODEL_CONFIG_FILE
    if not path.is_file():
        return None
    value = check_file_object(read_json(path), MODEL_CONFIG_KEYS, str(path))
    if value.get("model", "gpt") != "gpt":
        raise CheckpointError(f"{path}: a {value['model']} checkpoint; export it with convert-checkpoint --to-hf")
    shape = check_transformer_shape(value["shape"], GPTShape, str(path))
    check_vocabulary(str(path), value["vocab_size"], shape["padded_vocab_size"], f"{SHAPE_PREFIX}padded_vocab_size")
    check_token_id(str(path), "eod_id", value.get("eod_id"), value["vocab_size"])
    if value.get("model_type", GPT_HF_MODEL_TYPES[0]) not in GPT_HF_MODEL_TYPES:
        raise ModelFileError(f"{path}: model_type={value['model_type']!r}: must be one of "
                             f"{', '.join(GPT_HF_MODEL_TYPES)}")
    try:
        shape = {**value["shape"], "moe": moe_settings_from_json(value["shape"].get("moe"))}
        return CheckpointModel(shape=GPTShape(**shape), vocab_size=int(value["vocab_size"]),
                               eod_id=value.get("eod_id"), hf_model_type=value.get("model_type"))
    except (KeyError, TypeError, ValueError) as error:
        raise CheckpointError(f"{path}: malformed model config ({error!r})") from None


def model_config_from_hf(hf_config: dict[str, Any]) -> dict[str, Any]:
    """The `trainer.config.ModelConfig` fields that a (checked) HF config fixes (for ``train --load-hf``)."""
    return _model_fields(decoder_shape(hf_config), hf_config["vocab_size"])


def _model_fields(shape: GPTShape, vocab_size: int) -> dict[str, Any]:
    """The `trainer.config.ModelConfig` fields that rebuild ``shape`` over a real vocabulary of ``vocab_size``."""
    return {"num_layers": shape.num_layers, "hidden_size": shape.hidden_size,
            "num_attention_heads": shape.num_attention_heads, "ffn_hidden_size": shape.ffn_hidden_size,
            "max_position_embeddings": shape.max_position_embeddings, "vocab_size": vocab_size,
            "layernorm_epsilon": shape.layernorm_epsilon, **decoder_option_fields(shape)}


def decoder_option_fields(shape: GPTShape) -> dict[str, Any]:
    """The `trainer.config.ModelConfig` fields of ``shape``'s Llama-class options (the inverse of
    `trainer.models.gpt.training.decoder_options`, but for kv_channels and the untied head, which the callers that
    read them add); the Llama 3.1 constants other than the factor are Megatron's fixed ones and have no flag."""
    return {"normalization": shape.normalization, "apply_layernorm_1p": shape.apply_layernorm_1p,
            "swiglu": shape.swiglu, "position_embedding_type": shape.position_embedding_type,
            "rotary_base": shape.rotary_base, "rotary_percent": shape.rotary_percent,
            "rotary_seq_len_interpolation_factor": (int(shape.rotary_interpolation_factor)
                                                    if shape.rotary_interpolation_factor is not None else None),
            "use_rope_scaling": shape.rope_scaling_factor is not None,
            **({"rope_scaling_factor": shape.rope_scaling_factor} if shape.rope_scaling_factor is not None else {}),
            "group_query_attention": shape.num_query_groups is not None,
            "num_query_groups": shape.num_query_groups,
            "disable_bias_linear": not shape.add_bias_linear, "add_qkv_bias": shape.add_qkv_bias,
            "qk_layernorm": shape.qk_layernorm}


def gpt_checkpoint_train_defaults(root: str | os.PathLike) -> dict[str, dict[str, Any]]:
    """GPT's `checkpoint_train_defaults`: the shape, real vocabulary and experts of model_config.json, the tokenizer."""
    model = read_model_config(root)
    return {"model": {"model": "gpt", **_model_fields(model.shape, model.vocab_size),
                      "kv_channels": model.shape.kv_channels,
                      "untie_embeddings_and_output_weights": model.shape.untie_embeddings_and_output_weights},
            "moe": moe_config_fields(model.shape.moe), **tokenizer_train_defaults(root)}


def hf_train_defaults(hf_dir: str | os.PathLike) -> dict[str, dict[str, Any]]:
    """Defaults that ``train --load-hf DIR`` takes from the directory, by `TrainConfig` section.

    ``model``: the shape fields of `model_config_from_hf` (for a Llama-class directory also the head width and
    untied head, no dropout), ``moe``: Mixtral's experts; ``data``: the tokenizer options of the tokenizer files stored there (absent when there are none). Flags the user
    gives still win; `load_hf_weights` then rejects a shape the weights do not fit.

    Raises:
        HFConversionError: the directory is not a convertible decoder, or (Llama-class) has rope settings
            the flags cannot express.
    """
    config = _checked_config(hf_dir)
    sections = {"model": model_config_from_hf(config)}
    if is_llama_config(config):
        check_flag_expressible(config, str(Path(hf_dir) / "config.json"))
        shape = decoder_shape(config)
        # Llama-class models train without dropout (Megatron's Llama examples: --hidden-dropout 0
        # --attention-dropout 0).
        sections["model"] |= {"hidden_dropout": shape.hidden_dropout, "attention_dropout": shape.attention_dropout,
                              "kv_channels": shape.kv_channels,
                              "untie_embeddings_and_output_weights": shape.untie_embeddings_and_output_weights}
        if shape.moe is not None:
            sections["moe"] = moe_config_fields(shape.moe)
    return {**sections, **tokenizer_train_defaults(hf_dir)}


def _checked_config(hf_dir: str | os.PathLike) -> dict[str, Any]:
    config = read_hf_config(hf_dir)
    check_decoder_config(config, str(Path(hf_dir) / "config.json"))
    return config


def import_hf_checkpoint(hf_dir: str | os.PathLike, root: str | os.PathLike, make_vocab_size_divisible_by: int = DEFAULT_DIVISIBLE_BY,
                         tensor_model_parallel_size: int = 1) -> Path:
    """Convert a HF GPT-2 or Llama-class directory into a model-only tokenmill checkpoint at iteration 0.

    Args:
        hf_dir: local directory with config.json and the weights.
        root: checkpoint root to create (must not hold a checkpoint yet).
        make_vocab_size_divisible_by: vocabulary padding, as the ``train`` run that loads it.
        tensor_model_parallel_size: tp degree of that run (the padding is a multiple of both).

    Returns:
        The checkpoint directory written.

    Raises:
        HFConversionError: the directory is not a convertible decoder (message names the file/field/tensor).
        CheckpointError: ``root`` already holds a checkpoint.
    """
    if (Path(root) / LATEST_FILE).exists():
        raise CheckpointError(f"{root} already holds a checkpoint; convert into a new directory")
    config = _checked_config(hf_dir)
    padded = pad_vocab_size(config["vocab_size"], make_vocab_size_divisible_by, tensor_model_parallel_size)
    shape = decoder_shape(config, padded)
    state = decoder_state(read_hf_weights(hf_dir), config, shape, str(hf_dir))
    Path(root).mkdir(parents=True, exist_ok=True)
    copy_tokenizer_files(hf_dir, root)
    save_model_config(root, CheckpointModel(shape, config["vocab_size"], hf_eos_id(config), config["model_type"]))
    # The pointer file, written last by save_checkpoint, is what makes the root a valid checkpoint.
    return save_checkpoint(root, IMPORTED_ITERATION, {MODEL_PREFIX + name: t for name, t in state.items()})


def parameter_shapes(shape: GPTShape) -> dict[str, torch.Size]:
    """Name -> shape of every parameter of ``GPT(shape)`` (the tied head once), built on the meta device,
    in the checkpoint layout (q, k and v apart, also for a fused ``shape``)."""
    with torch.device("meta"):
        model = GPT(shape.unfused())
    return {name: p.shape for name, p in model.named_parameters()}


def _infer_model(root: Path, iteration: int, num_attention_heads: int | None,
                 vocab_size: int | None, verify: bool) -> CheckpointModel:
    """The model of a checkpoint without ``model_config.json``: sizes from the tensors, the rest from the caller."""
    if num_attention_heads is None or vocab_size is None:
        raise CheckpointError(f"{root} has no {MODEL_CONFIG_FILE}: give num_attention_heads and vocab_size")
    saved = SafeFileSystemReader(checkpoint_dir(root, iteration), verify).read_metadata().state_dict_metadata
    sizes = {name.removeprefix(MODEL_PREFIX): tuple(meta.size) for name, meta in saved.items()
             if name.startswith(MODEL_PREFIX) and isinstance(meta, TensorStorageMetadata)}
    try:
        padded, hidden = sizes["tok_embeddings.weight"]
        layers = {int(m.group(1)) for name in sizes if (m := re.match(r"layers\.(\d+)\.", name))}
        shape = GPTShape(num_layers=len(layers), hidden_size=hidden, num_attention_heads=num_attention_heads,
                         ffn_hidden_size=sizes["layers.0.feed_forward.w1.weight"][0],
                         max_position_embeddings=sizes["pos_embeddings.weight"][0], padded_vocab_size=padded)
    except KeyError as error:
        raise CheckpointError(f"{checkpoint_dir(root, iteration)} holds no GPT model tensor {error}") from None
    if hidden % num_attention_heads or vocab_size > padded:
        raise CheckpointError(f"{root}: num_attention_heads {num_attention_heads} / vocab_size {vocab_size} do not fit "
                              f"hidden size {hidden} / {padded} embedding rows")
    return CheckpointModel(shape, vocab_size, None)


def checkpoint_model(path: str | os.PathLike, num_attention_heads: int | None = None,
                     vocab_size: int | None = None, verify: bool = True) -> tuple[Path, int, CheckpointModel]:
    """Root, iteration and model of a tokenmill checkpoint (``model_config.json``, else the given sizes)."""
    root, iteration = resolve_checkpoint(path)
    model = read_model_config(root) or _infer_model(root, iteration, num_attention_heads, vocab_size, verify)
    return root, iteration, model


def read_checkpoint_state(root: Path, iteration: int, shape: GPTShape, verify: bool = True) -> dict[str, torch.Tensor]:
    """The full model parameters of a checkpoint, in this process (resharded from any saved layout)."""
    state = {MODEL_PREFIX + name: torch.empty(size) for name, size in parameter_shapes(shape).items()}
    load_checkpoint(root, iteration, state, verify=verify)
    return {name.removeprefix(MODEL_PREFIX): t for name, t in state.items()}


def export_hf_checkpoint(path: str | os.PathLike, hf_dir: str | os.PathLike, num_attention_heads: int | None = None,
                         vocab_size: int | None = None, verify: bool = True) -> Path:
    """Write a tokenmill checkpoint as a ``GPT2LMHeadModel`` directory (config.json + model.safetensors).

    Args:
        path: checkpoint root (its latest iteration) or one ``iter_XXXXXXX`` directory.
        hf_dir: output directory; tokenizer files found in the checkpoint root are copied into it.
        num_attention_heads: needed only when the root has no ``model_config.json``.
        vocab_size: likewise (the real vocabulary size; padded rows are dropped).
        verify: check the checkpoint's files against its manifest first.

    Returns:
        ``hf_dir``.

    Raises:
        CheckpointError: no checkpoint, or its tensors do not fit the model.
    """
    root, iteration, model = checkpoint_model(path, num_attention_heads, vocab_size, verify)
    if model.shape.moe is not None and is_gpt2_shape(model.shape):
        raise CheckpointError(f"{root} holds a mixture-of-experts GPT ({model.shape.moe.num_experts} experts), "
                              "which Hugging Face GPT-2 cannot express")
    state = read_checkpoint_state(root, iteration, model.shape, verify)
    try:
        config, tensors = export_decoder(state, model.shape, model.vocab_size, model.eod_id, model.hf_model_type)
    except HFConversionError as error:
        raise HFConversionError(f"{root}: {error}") from None
    return write_hf_directory(hf_dir, config, tensors, tokenizer_source=root)


# Fields of a run's shape that a HF directory's must equal (besides the experts): the sizes and the
# Llama-class options; q/k/v groups and head width compared as the properties they define.
_COMPARED_FIELDS = ("num_layers", "hidden_size", "num_attention_heads", "ffn_hidden_size", "max_position_embeddings",
                    "layernorm_epsilon", "query_groups", "head_dim",
                    *(name for name in DECODER_OPTIONS if name not in ("num_query_groups", "kv_channels")))


def _check_shape_fits(config: dict[str, Any], shape: GPTShape, source: str) -> None:
    theirs = decoder_shape(config, shape.padded_vocab_size)
    if shape.moe is not None and theirs.moe is None and not is_llama_config(config):
        raise CheckpointError(f"{source}: a Hugging Face GPT-2 has no experts but the run asks for "
                              f"{expert_layout(shape.moe)}")
    if (shape.moe is None) != (theirs.moe is None) or (shape.moe is not None and
                                                       not shape.moe.same_parameters(theirs.moe)):
        raise CheckpointError(f"{source}: the model has experts {expert_layout(theirs.moe)} but the run asks for "
                              f"{expert_layout(shape.moe)}")
    # Zero-centred norm weights are a way of storing them (converted on load), not another model.
    compared = [f for f in _COMPARED_FIELDS if not (f == "apply_layernorm_1p" and is_llama_config(config))]
    for field in compared:
        if getattr(theirs, field) != getattr(shape, field):
            raise CheckpointError(f"{source}: the model has {field} {getattr(theirs, field)} but the run asks for "
                                  f"{getattr(shape, field)}")


def load_hf_weights(named_parameters: list[tuple[str, nn.Parameter]], hf_dir: str | os.PathLike,
                    shape: GPTShape) -> dict[str, Any]:
    """Fill a model's parameters with HF GPT-2 or Llama-class weights in place, in any tp/pp/dp layout.

    Args:
        named_parameters: this rank's parameters under full-model names (a pipeline stage's tied head
            copy named ``tok_embeddings.weight``), plain tensors or DTensors (TP, FSDP2).
        hf_dir: local HF directory (`trainer.models.gpt.hf_decoders.GPT_HF_MODEL_TYPES`).
        shape: the model's dimensions; the vocabulary may be padded beyond the config's.

    Returns:
        The HF config.

    Raises:
        HFConversionError: the directory is not a convertible decoder.
        CheckpointError: its dimensions or options differ from ``shape``.
    """
    config = _checked_config(hf_dir)
    _check_shape_fits(config, shape, str(Path(hf_dir) / "config.json"))
    state = decoder_state(read_hf_weights(hf_dir), config, shape, str(hf_dir))
    for name, param in named_parameters:
        copy_into_parameter(param, state[name])
    logger.info("loaded Hugging Face weights from %s", hf_dir)
    return config
