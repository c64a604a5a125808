"""Hugging Face T5/mT5 <-> tokenmill `trainer.models.t5.model.T5`: local directories only, never the Hub.

    model = load_hf_t5("t5-small/")                 # T5ForConditionalGeneration or MT5ForConditionalGeneration
    save_hf_t5(model, "out/", model_type="mt5")     # config.json + model.safetensors

Names map one-to-one (``encoder.block.{i}.layer.0.SelfAttention.q`` = ``encoder_layers.{i}.attention.wq``,
``layer.1.DenseReluDense.wi|wi_0|wi_1|wo`` = ``feed_forward.w1|w1|w3|w2``, the decoder's
``layer.1.EncDecAttention`` = ``cross_attention``, block 0's ``relative_attention_bias`` =
``{encoder,decoder}_position_bias.embedding``, ``shared`` = ``shared``, ``lm_head`` = ``output``).

Which variant a directory holds:
- the head is tied when ``lm_head.weight`` is absent or equal to ``shared.weight`` (transformers 5
  always declares ``tie_word_embeddings`` true and unties on load when the two differ);
- the decoder output is scaled by d_model**-0.5 when ``scale_decoder_outputs`` says so, else (older
  T5 configs) when ``tie_word_embeddings`` is not false; mT5 never scales (transformers 5's MT5);
- ``feed_forward_proj`` "relu" or "gated-gelu" chooses the MLP.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from trainer.config import FEED_FORWARD_KINDS
from trainer.hf_files import is_hf_directory, read_hf_config, read_hf_weights, write_hf_directory
from trainer.errors import HFConversionError
from trainer.models.t5.model import T5, T5Shape

T5_ARCHITECTURES = {"t5": "T5ForConditionalGeneration", "mt5": "MT5ForConditionalGeneration"}
# The encoder's and decoder's copies of the shared embedding: transformers ties both to shared.weight,
# so a file may hold them, equal to it.
_EMBEDDING_COPIES = ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight")
# Tensors a file may hold besides ours: the embedding copies, and a cross-attention bias that old
# checkpoints carry but no model uses.
_IGNORED = (*_EMBEDDING_COPIES, "decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight")


def _attention_names(ours: str, hf: str) -> dict[str, str]:
    return {f"{ours}.w{x}.weight": f"{hf}.{y}.weight" for x, y in (("q", "q"), ("k", "k"), ("v", "v"), ("o", "o"))}


def _mlp_names(ours: str, hf: str, gated: bool) -> dict[str, str]:
    if gated:
        return {f"{ours}.w1.weight": f"{hf}.wi_0.weight", f"{ours}.w3.weight": f"{hf}.wi_1.weight",
                f"{ours}.w2.weight": f"{hf}.wo.weight"}
    return {f"{ours}.w1.weight": f"{hf}.wi.weight", f"{ours}.w2.weight": f"{hf}.wo.weight"}


def hf_t5_names(shape: T5Shape) -> dict[str, str]:
    """Our parameter names -> Hugging Face names (the head only when untied)."""
    gated = shape.feed_forward == "gated-gelu"
    bias = "block.0.layer.0.SelfAttention.relative_attention_bias.weight"
    names = {"shared.weight": "shared.weight",
             "encoder_position_bias.embedding.weight": f"encoder.{bias}",
             "decoder_position_bias.embedding.weight": f"decoder.{bias}",
             "encoder_norm.weight": "encoder.final_layer_norm.weight",
             "decoder_norm.weight": "decoder.final_layer_norm.weight"}
    for i in range(shape.num_encoder_layers):
        ours, hf = f"encoder_layers.{i}", f"encoder.block.{i}.layer"
        names |= _attention_names(f"{ours}.attention", f"{hf}.0.SelfAttention")
        names |= _mlp_names(f"{ours}.feed_forward", f"{hf}.1.DenseReluDense", gated)
        names |= {f"{ours}.attention_norm.weight": f"{hf}.0.layer_norm.weight",
                  f"{ours}.ffn_norm.weight": f"{hf}.1.layer_norm.weight"}
    for i in range(shape.num_decoder_layers):
        ours, hf = f"decoder_layers.{i}", f"decoder.block.{i}.layer"
        names |= _attention_names(f"{ours}.attention", f"{hf}.0.SelfAttention")
        names |= _attention_names(f"{ours}.cross_attention", f"{hf}.1.EncDecAttention")
        names |= _mlp_names(f"{ours}.feed_forward", f"{hf}.2.DenseReluDense", gated)
        names |= {f"{ours}.attention_norm.weight": f"{hf}.0.layer_norm.weight",
                  f"{ours}.cross_attention_norm.weight": f"{hf}.1.layer_norm.weight",
                  f"{ours}.ffn_norm.weight": f"{hf}.2.layer_norm.weight"}
    if not shape.tie_word_embeddings:
        names["output.weight"] = "lm_head.weight"
    return names


def _field(config: dict[str, Any], name: str, source: str) -> Any:
    if name not in config:
        raise HFConversionError(f"{source}: config.json has no {name}")
    return config[name]


def shape_from_hf_t5(config: dict[str, Any], tensors: dict[str, torch.Tensor], source: str) -> T5Shape:
    """Our shape of a T5/mT5 config.json and its weights.

    Raises:
        HFConversionError: not a T5/mT5 config, a missing field, or an MLP kind we do not implement.
    """
    model_type = config.get("model_type")
    if model_type not in T5_ARCHITECTURES:
        raise HFConversionError(f"{source}: model_type {model_type!r} is not one of {', '.join(T5_ARCHITECTURES)}")
    feed_forward = config.get("feed_forward_proj", "relu")
    if feed_forward not in FEED_FORWARD_KINDS:
        raise HFConversionError(f"{source}: feed_forward_proj {feed_forward!r} is not one of "
                                f"{', '.join(FEED_FORWARD_KINDS)}")
    head = tensors.get("lm_head.weight")
    tied = head is None or ("shared.weight" in tensors and torch.equal(head, tensors["shared.weight"]))
    if model_type == "mt5":
        scale = bool(config.get("scale_decoder_outputs", False))
    else:
        scale = bool(config.get("scale_decoder_outputs", config.get("tie_word_embeddings", True) is not False))
    num_layers = _field(config, "num_layers", source)
    return T5Shape(
        vocab_size=_field(config, "vocab_size", source), d_model=_field(config, "d_model", source),
        d_kv=_field(config, "d_kv", source), d_ff=_field(config, "d_ff", source),
        num_heads=_field(config, "num_heads", source), num_encoder_layers=num_layers,
        num_decoder_layers=config.get("num_decoder_layers") or num_layers, feed_forward=feed_forward,
        tie_word_embeddings=tied, scale_decoder_outputs=scale,
        relative_attention_num_buckets=config.get("relative_attention_num_buckets", 32),
        relative_attention_max_distance=config.get("relative_attention_max_distance", 128),
        layer_norm_epsilon=config.get("layer_norm_epsilon", 1e-6),
        initializer_factor=config.get("initializer_factor", 1.0))


def state_from_hf_t5(tensors: dict[str, torch.Tensor], shape: T5Shape, source: str) -> dict[str, torch.Tensor]:
    """Our state dict from Hugging Face tensors.

    Raises:
        HFConversionError: a tensor is missing, or a tensor is left over that we would silently drop.
    """
    names = hf_t5_names(shape)
    missing = sorted(hf for hf in names.values() if hf not in tensors)
    if missing:
        raise HFConversionError(f"{source}: missing tensor {missing[0]} ({len(missing)} missing)")
    known = set(names.values()) | set(_IGNORED) | ({"lm_head.weight"} if shape.tie_word_embeddings else set())
    unexpected = sorted(set(tensors) - known)
    if unexpected:
        raise HFConversionError(f"{source}: unexpected tensor {unexpected[0]} ({len(unexpected)} unexpected)")
    _check_embedding_copies(tensors, source)
    return {ours: tensors[hf] for ours, hf in names.items()}


def _check_embedding_copies(tensors: dict[str, torch.Tensor], source: str) -> None:
    """Refuse encoder/decoder embeddings that differ from ``shared.weight``: our T5 has one embedding
    (as transformers' does, which would silently tie them on load), so importing them would change the model.

    Raises:
        HFConversionError: naming the tensors that differ.
    """
    shared = tensors["shared.weight"]
    differ = [name for name in _EMBEDDING_COPIES
              if name in tensors and (tensors[name].shape != shared.shape or not torch.equal(tensors[name], shared))]
    if differ:
        raise HFConversionError(f"{source}: {' and '.join(differ)} differ from shared.weight; a T5 shares one "
                                "embedding between encoder, decoder and shared, so these weights cannot be imported "
                                "as they are")


def hf_t5_config(shape: T5Shape, model_type: str, eos_id: int = 1, pad_id: int = 0) -> dict[str, Any]:
    """config.json for a shape (T5Config / MT5Config fields).

    Raises:
        HFConversionError: an mT5 with a scaled decoder output (transformers' MT5 cannot express it).
    """
    if model_type == "mt5" and shape.scale_decoder_outputs:
        raise HFConversionError("an mT5 model cannot scale its decoder output; export it as model_type t5")
    config = {
        "architectures": [T5_ARCHITECTURES[model_type]], "model_type": model_type, "vocab_size": shape.vocab_size,
        "d_model": shape.d_model, "d_kv": shape.d_kv, "d_ff": shape.d_ff, "num_heads": shape.num_heads,
        "num_layers": shape.num_encoder_layers, "num_decoder_layers": shape.num_decoder_layers,
        "feed_forward_proj": shape.feed_forward, "tie_word_embeddings": shape.tie_word_embeddings,
        "relative_attention_num_buckets": shape.relative_attention_num_buckets,
        "relative_attention_max_distance": shape.relative_attention_max_distance,
        "layer_norm_epsilon": shape.layer_norm_epsilon, "initializer_factor": shape.initializer_factor,
        "dropout_rate": shape.dropout_rate, "is_encoder_decoder": True, "eos_token_id": eos_id,
        "pad_token_id": pad_id, "decoder_start_token_id": pad_id,
    }
    if model_type == "t5":
        config["scale_decoder_outputs"] = shape.scale_decoder_outputs
    return config


def is_hf_t5_directory(path: str | os.PathLike) -> bool:
    """True for a local HF directory whose config.json names a T5 or mT5 (``model_type``)."""
    return is_hf_directory(path) and read_hf_config(path).get("model_type") in T5_ARCHITECTURES


def load_hf_t5(directory: str | os.PathLike) -> T5:
    """A `T5` holding the weights of a local T5ForConditionalGeneration/MT5ForConditionalGeneration directory.

    Raises:
        HFConversionError: the directory, its config or its tensors do not describe a T5/mT5.
    """
    source = str(directory)
    config = read_hf_config(directory)
    tensors = read_hf_weights(directory)
    shape = shape_from_hf_t5(config, tensors, source)
    state = state_from_hf_t5(tensors, shape, source)
    with torch.device("meta"):
        model = T5(shape)
    expected = {name: p.shape for name, p in model.named_parameters()}
    for name, tensor in state.items():
        if tensor.shape != expected[name]:
            raise HFConversionError(f"{source}: {hf_t5_names(shape)[name]} has shape {tuple(tensor.shape)}, "
                                    f"expected {tuple(expected[name])} from config.json")
    # A tied head has no tensor of its own: it is missing here and shared again by tie_weights().
    model.load_state_dict({k: v.float() for k, v in state.items()}, strict=False, assign=True)
    model.tie_weights()
    return model


def save_hf_t5(model: T5, directory: str | os.PathLike, model_type: str = "t5", eos_id: int = 1,
               pad_id: int = 0, tokenizer_source: str | os.PathLike | None = None) -> Path:
    """Write ``config.json`` and ``model.safetensors`` of a (whole, unsharded) `T5` into ``directory``
    (and the tokenizer files found in ``tokenizer_source``)."""
    shape = model.shape
    config = hf_t5_config(shape, model_type, eos_id, pad_id)
    state = dict(model.named_parameters())
    tensors = {hf: state[ours].detach().contiguous().clone() for ours, hf in hf_t5_names(shape).items()}
    return write_hf_directory(directory, config, tensors, tokenizer_source=tokenizer_source)
