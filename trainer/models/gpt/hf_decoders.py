"""Which Hugging Face decoder a config.json or a GPT shape is: GPT-2 (`trainer.models.gpt.hf`) or a
Llama-class model (`trainer.models.gpt.hf_llama`), behind one set of functions for conversion, ``train
--load-hf``, ``generate`` and ``evaluate``.

    check_decoder_config(config, "llama/config.json")            # one line naming the field, or nothing
    shape = decoder_shape(config, padded_vocab_size=384)
    state = decoder_state(tensors, config, shape, "llama/")
    config, tensors = export_decoder(state, shape, vocab_size=300, eod_id=2, recorded_model_type="llama")
"""

from __future__ import annotations

from typing import Any

import torch

from trainer.errors import HFConversionError
from trainer.models.gpt.hf import (
    GPT2_ARCHITECTURE,
    GPT2_MODEL_TYPE,
    check_hf_config,
    hf_config_from_shape,
    shape_from_hf_config,
    state_from_hf,
    state_to_hf,
)
from trainer.models.gpt.hf_llama import (
    ARCHITECTURES,
    LLAMA_MODEL_TYPES,
    check_llama_config,
    export_model_type,
    llama_config_from_shape,
    shape_from_llama_config,
    state_from_llama,
    state_to_llama,
)
from trainer.models.gpt.model import GPTShape

GPT_HF_MODEL_TYPES = (GPT2_MODEL_TYPE, *LLAMA_MODEL_TYPES)
"""The ``model_type`` values of the Hugging Face decoders the GPT family converts."""
_ALL_ARCHITECTURES = {GPT2_MODEL_TYPE: GPT2_ARCHITECTURE, **ARCHITECTURES}


def is_llama_config(config: dict[str, Any]) -> bool:
    """Whether a config.json is one of the Llama-class decoders."""
    return config.get("model_type") in LLAMA_MODEL_TYPES


def check_decoder_config(config: dict[str, Any], source: str) -> None:
    """Reject a config our GPT cannot reproduce exactly (one line naming the file and the field).

    Raises:
        HFConversionError, ModelFileError: not a decoder we convert, or a setting we do not implement.
    """
    model_type = config.get("model_type")
    if model_type not in GPT_HF_MODEL_TYPES:
        known = ", ".join(f"{name!r} ({architecture})" for name, architecture in _ALL_ARCHITECTURES.items())
        raise HFConversionError(f"{source}: model_type is {model_type!r}, only {known} can be converted")
    if is_llama_config(config):
        check_llama_config(config, source)
    else:
        check_hf_config(config, source)


def hf_eos_id(config: dict[str, Any]) -> int | None:
    """The end-of-document id of a config: its ``eos_token_id``, the first of a list (Llama 3's instruct models
    name several)."""
    eos = config.get("eos_token_id")
    return eos[0] if isinstance(eos, list) and eos else None if isinstance(eos, list) else eos


def decoder_shape(config: dict[str, Any], padded_vocab_size: int | None = None) -> GPTShape:
    """Our shape for a checked config (`shape_from_hf_config` or `shape_from_llama_config`)."""
    if is_llama_config(config):
        return shape_from_llama_config(config, padded_vocab_size)
    return shape_from_hf_config(config, padded_vocab_size)


def decoder_state(tensors: dict[str, torch.Tensor], config: dict[str, Any], shape: GPTShape,
                  source: str) -> dict[str, torch.Tensor]:
    """HF weights -> our parameters (`state_from_hf` or `state_from_llama`)."""
    if is_llama_config(config):
        return state_from_llama(tensors, config, shape, source)
    return state_from_hf(tensors, config, shape, source)


def is_gpt2_shape(shape: GPTShape) -> bool:
    """Whether a shape has none of the Llama-class options (GPT-2's decoder)."""
    return (shape.normalization == "LayerNorm" and not shape.swiglu and not shape.apply_layernorm_1p
            and shape.position_embedding_type == "learned_absolute" and shape.add_bias_linear
            and not shape.add_qkv_bias and not shape.qk_layernorm and not shape.untie_embeddings_and_output_weights
            and shape.query_groups == shape.num_attention_heads
            and shape.head_dim * shape.num_attention_heads == shape.hidden_size)


def export_decoder(state: dict[str, torch.Tensor], shape: GPTShape, vocab_size: int, eod_id: int | None,
                   recorded_model_type: str | None) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """(config.json, tensors) of the HF decoder a checkpoint's shape is: GPT-2, else the Llama-class
    architecture of `export_model_type` (the recorded one where it expresses the shape).

    Raises:
        HFConversionError: a shape no HF architecture we write expresses.
    """
    if is_gpt2_shape(shape):
        return hf_config_from_shape(shape, vocab_size, eod_id), state_to_hf(state, shape.num_layers, vocab_size)
    model_type = export_model_type(shape, recorded_model_type)
    return (llama_config_from_shape(shape, vocab_size, eod_id, model_type),
            state_to_llama(state, shape, vocab_size))
