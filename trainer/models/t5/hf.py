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

from trainer.config import ModelConfig, MoEConfig
from trainer.checkpoint.hf_files import CONFIG_FILE, is_hf_directory, read_hf_config, read_hf_weights, write_hf_directory
from trainer.errors import HFConversionError
from trainer.checkpoint.model_files import check_model_sizes
from trainer.checkpoint.model_memory import transformer_parameters
from trainer.models.t5.model import T5, T5Shape
from trainer.models.t5.settings import FEED_FORWARD_KINDS, T5Config
from trainer.models.t5.switch import (
    SWITCH_ARCHITECTURE,
    SWITCH_MODEL_TYPE,
    expert_tensor_names,
    feed_forward_prefixes,
    moe_from_switch_config,
    stack_experts,
    switch_config_fields,
    unstack_experts,
)

T5_ARCHITECTURES = {"t5": "T5ForConditionalGeneration", "mt5": "MT5ForConditionalGeneration",
                    SWITCH_MODEL_TYPE: SWITCH_ARCHITECTURE}
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


def _feed_forward_names(shape: T5Shape) -> dict[str, str]:
    """Every block's MLP: a dense one's weights (``DenseReluDense``; Switch Transformers: ``mlp``), a MoE
    layer's router (its experts are stacked: `expert_names`)."""
    gated = shape.feed_forward == "gated-gelu"
    names = {}
    for index, ours, hf in feed_forward_prefixes(shape.num_encoder_layers, shape.num_decoder_layers):
        if shape.moe is None:
            names |= _mlp_names(ours, f"{hf}.DenseReluDense", gated)
        elif shape.moe.is_moe_layer(index):
            names[f"{ours}.router.weight"] = f"{hf}.mlp.router.classifier.weight"
        else:
            names |= _mlp_names(ours, f"{hf}.mlp", gated)
    return names


def expert_names(shape: T5Shape) -> dict[str, list[str]]:
    """Our stacked expert weights -> Hugging Face's per-expert names (none for a dense T5)."""
    if shape.moe is None:
        return {}
    return expert_tensor_names(shape.moe, shape.num_encoder_layers, shape.num_decoder_layers)


def hf_t5_names(shape: T5Shape) -> dict[str, str]:
    """Our parameter names -> Hugging Face names, one to one (the head only when untied; stacked experts:
    `expert_names`)."""
    bias = "block.0.layer.0.SelfAttention.relative_attention_bias.weight"
    names = {"shared.weight": "shared.weight",
             "encoder_position_bias.embedding.weight": f"encoder.{bias}",
             "decoder_position_bias.embedding.weight": f"decoder.{bias}",
             "encoder_norm.weight": "encoder.final_layer_norm.weight",
             "decoder_norm.weight": "decoder.final_layer_norm.weight"}
    for i in range(shape.num_encoder_layers):
        ours, hf = f"encoder_layers.{i}", f"encoder.block.{i}.layer"
        names |= _attention_names(f"{ours}.attention", f"{hf}.0.SelfAttention")
        names |= {f"{ours}.attention_norm.weight": f"{hf}.0.layer_norm.weight",
                  f"{ours}.ffn_norm.weight": f"{hf}.1.layer_norm.weight"}
    for i in range(shape.num_decoder_layers):
        ours, hf = f"decoder_layers.{i}", f"decoder.block.{i}.layer"
        names |= _attention_names(f"{ours}.attention", f"{hf}.0.SelfAttention")
        names |= _attention_names(f"{ours}.cross_attention", f"{hf}.1.EncDecAttention")
        names |= {f"{ours}.attention_norm.weight": f"{hf}.0.layer_norm.weight",
                  f"{ours}.cross_attention_norm.weight": f"{hf}.1.layer_norm.weight",
                  f"{ours}.ffn_norm.weight": f"{hf}.2.layer_norm.weight"}
    names |= _feed_forward_names(shape)
    if not shape.tie_word_embeddings:
        names["output.weight"] = "lm_head.weight"
    return names


def _field(config: dict[str, Any], name: str, source: str) -> Any:
    if name not in config:
        raise HFConversionError(f"{source}: no {name}")
    return config[name]


# A T5 config's keys (Hugging Face's, which our `T5Shape` keeps) -> the `train` config fields of the same
# meaning, whose types and ranges they get.
T5_SPELLINGS = {"d_model": "hidden_size", "d_ff": "ffn_hidden_size", "num_heads": "num_attention_heads",
                "num_encoder_layers": "num_layers", "num_decoder_layers": "decoder_num_layers", "d_kv": "kv_channels",
                "layer_norm_epsilon": "layernorm_epsilon", "dropout_rate": "hidden_dropout"}


def check_t5_values(values: dict[str, Any], source: str, encoder_layers: str, experts: str | None = None,
                    prefix: str = "", sections: tuple[type, ...] = (ModelConfig, T5Config)) -> None:
    """A T5 config.json's or model_config.json shape's values (types, ranges) and the memory of its model.

    Args:
        encoder_layers: the key of the encoder's block count (config.json: num_layers; ours: num_encoder_layers).
        experts: the key of the expert count (Switch), if any.

    Raises:
        ModelFileError: one line naming ``source`` and the key.
    """
    layers = (encoder_layers, "num_decoder_layers")

    def parameters(sizes) -> int:
        return transformer_parameters(sizes[layers[0]] + sizes[layers[1]], sizes["d_model"], sizes["d_ff"],
                                      sizes["vocab_size"], experts=sizes[experts] if experts else 1,
                                      attention_width=sizes["num_heads"] * sizes["d_kv"])

    sizes = (*layers, "d_model", "d_ff", "d_kv", "num_heads", "vocab_size", *((experts,) if experts else ()))
    check_model_sizes(values, source, T5_SPELLINGS, parameters, sizes, layers, prefix,
                      defaults={"num_decoder_layers": values.get(encoder_layers)}, sections=sections)


def shape_from_hf_t5(config: dict[str, Any], tensors: dict[str, torch.Tensor], source: str) -> T5Shape:
    """Our shape of a T5/mT5 config.json and its weights (``source``: their directory).

    Raises:
        HFConversionError: not a T5/mT5 config, a missing field, or an MLP kind we do not implement.
        ModelFileError: a value of the wrong type or range, or a model this machine cannot hold.
    """
    source = str(Path(source) / CONFIG_FILE)  # what every message below is about
    model_type = config.get("model_type")
    if model_type not in T5_ARCHITECTURES:
        raise HFConversionError(f"{source}: model_type {model_type!r} is not one of {', '.join(T5_ARCHITECTURES)}")
    switch = model_type == SWITCH_MODEL_TYPE
    check_t5_values(config, source, "num_layers", "num_experts" if switch else None,
                    sections=(ModelConfig, T5Config, MoEConfig) if switch else (ModelConfig, T5Config))
    # Switch Transformers' MLPs (dense and experts) are non-gated, with dense_act_fn (checked: relu).
    moe = moe_from_switch_config(config, source) if switch else None
    feed_forward = "relu" if switch else config.get("feed_forward_proj", "relu")
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
        initializer_factor=config.get("initializer_factor", 1.0), moe=moe)


def state_from_hf_t5(tensors: dict[str, torch.Tensor], shape: T5Shape, source: str) -> dict[str, torch.Tensor]:
    """Our state dict from Hugging Face tensors.

    Raises:
        HFConversionError: a tensor is missing, or a tensor is left over that we would silently drop.
    """
    names, experts = hf_t5_names(shape), expert_names(shape)
    per_expert = [hf for theirs in experts.values() for hf in theirs]
    missing = sorted(hf for hf in [*names.values(), *per_expert] if hf not in tensors)
    if missing:
        raise HFConversionError(f"{source}: missing tensor {missing[0]} ({len(missing)} missing)")
    known = (set(names.values()) | set(per_expert) | set(_IGNORED)
             | ({"lm_head.weight"} if shape.tie_word_embeddings else set()))
    unexpected = sorted(set(tensors) - known)
    if unexpected:
        raise HFConversionError(f"{source}: unexpected tensor {unexpected[0]} ({len(unexpected)} unexpected)")
    _check_embedding_copies(tensors, source)
    for theirs in experts.values():
        for hf in theirs[1:]:
            if tensors[hf].shape != tensors[theirs[0]].shape:
                raise HFConversionError(f"{source}: {hf} has shape {tuple(tensors[hf].shape)}, expected "
                                        f"{tuple(tensors[theirs[0]].shape)} as {theirs[0]}")
    return {ours: tensors[hf] for ours, hf in names.items()} | stack_experts(tensors, experts)


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
    if model_type == SWITCH_MODEL_TYPE:
        config |= _switch_fields(shape)
    elif shape.moe is not None:
        raise HFConversionError(f"a T5 with experts exports as model_type {SWITCH_MODEL_TYPE}, not {model_type}")
    return config


def _switch_fields(shape: T5Shape) -> dict[str, Any]:
    """What a switch_transformers config.json says beyond T5's: the experts, and the head scaling, which
    transformers' Switch applies exactly when ``tie_word_embeddings`` is true.

    Raises:
        HFConversionError: a dense model, gated MLPs, a tied unscaled head, or routing Switch cannot express.
    """
    if shape.moe is None:
        raise HFConversionError(f"a dense T5 has no experts; export it as model_type t5, not {SWITCH_MODEL_TYPE}")
    if shape.feed_forward != "relu":
        raise HFConversionError(f"Switch Transformers' MLPs are relu, this model's {shape.feed_forward}")
    if shape.tie_word_embeddings and not shape.scale_decoder_outputs:
        raise HFConversionError("Switch Transformers scale the decoder output of a tied head; this model does not")
    return {**switch_config_fields(shape.moe, shape.num_encoder_layers, shape.num_decoder_layers),
            "tie_word_embeddings": shape.scale_decoder_outputs}


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
            hf = hf_t5_names(shape).get(name) or f"{expert_names(shape)[name][0]} (stacked)"
            raise HFConversionError(f"{source}: {hf} has shape {tuple(tensor.shape)}, "
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
    tensors |= unstack_experts({name: p.detach() for name, p in state.items()}, expert_names(shape))
    return write_hf_directory(directory, config, tensors, tokenizer_source=tokenizer_source)
