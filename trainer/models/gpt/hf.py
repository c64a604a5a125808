"""Hugging Face GPT-2 <-> tokenmill: config mapping and state-dict conversion (pure functions).

``GPT2LMHeadModel`` and `trainer.models.gpt.model.GPT` hold the same weights under other names and layouts
(see `trainer.models.gpt.model`): HF's ``Conv1D`` stores ``[in, out]`` where ``nn.Linear`` stores ``[out, in]``,
and HF fuses q, k and v into one ``c_attn`` whose output columns are q | k | v. Our vocabulary may be
padded (Megatron's ``make_vocab_size_divisible_by``): import appends zero rows, export strips them.

    shape = shape_from_hf_config(config, padded_vocab_size=50304)
    ours = state_from_hf(hf_tensors, config, shape)            # names as GPT.named_parameters()
    hf_tensors = state_to_hf(ours, vocab_size=50257)           # names as GPT2LMHeadModel.state_dict()
"""

from __future__ import annotations

import re
from typing import Any

import torch

from trainer.errors import HFConversionError
from trainer.checkpoint.model_files import check_model_sizes, check_token_id
from trainer.checkpoint.model_memory import transformer_parameters
from trainer.models.gpt.fused_qkv import fuse_state
from trainer.models.gpt.model import GPTShape

GPT2_MODEL_TYPE = "gpt2"
GPT2_ARCHITECTURE = "GPT2LMHeadModel"
# HF's GPT-2 activations that are the tanh approximation our MLP computes.
TANH_GELUS = ("gelu_new", "gelu_pytorch_tanh")
# HF prefixes the GPT2Model weights with this inside GPT2LMHeadModel; old hub files have no prefix.
HF_PREFIX = "transformer."
HF_HEAD = "lm_head.weight"
# Per-layer attention buffers that old pytorch_model.bin files hold (the causal mask), not weights.
_HF_BUFFER = re.compile(r"^h\.\d+\.attn\.(bias|masked_bias)$")
# Config settings whose GPT-2 default is the only behaviour our model implements.
_REQUIRED_SETTINGS = {"scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False,
                      "add_cross_attention": False, "tie_word_embeddings": True}
# Settings written into an exported config.json besides the shape (GPT2Config's defaults).
# Our block modules -> HF's (q, k and v are fused into HF's attn.c_attn and handled apart).
_BLOCK_NAMES = {"attention_norm": "ln_1", "attention.wo": "attn.c_proj", "ffn_norm": "ln_2",
                "feed_forward.w1": "mlp.c_fc", "feed_forward.w2": "mlp.c_proj"}
_EXPORT_DEFAULTS = {"activation_function": "gelu_new", "reorder_and_upcast_attn": False, "use_cache": True,
                    **_REQUIRED_SETTINGS}


def _hf_layer_names(i: int) -> dict[str, str]:
    """Our block-``i`` names -> HF names (without the ``transformer.`` prefix), excluding fused q/k/v."""
    return {f"layers.{i}.{ours}.{kind}": f"h.{i}.{hf}.{kind}" for ours, hf in _BLOCK_NAMES.items()
            for kind in ("weight", "bias")}


def _is_conv1d_weight(hf_name: str) -> bool:
    """HF Conv1D weights are stored [in, out]: transposed relative to nn.Linear."""
    return hf_name.endswith(".weight") and (".attn." in hf_name or ".mlp." in hf_name)


def hf_weight_shapes(config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """Every weight of a GPT-2 checkpoint (names without the ``transformer.`` prefix) and its shape."""
    h, f = config["n_embd"], config.get("n_inner") or 4 * config["n_embd"]
    shapes = {"wte.weight": (config["vocab_size"], h), "wpe.weight": (config["n_positions"], h),
              "ln_f.weight": (h,), "ln_f.bias": (h,)}
    for i in range(config["n_layer"]):
        layer = f"h.{i}."
        shapes |= {layer + "ln_1.weight": (h,), layer + "ln_1.bias": (h,), layer + "ln_2.weight": (h,),
                   layer + "ln_2.bias": (h,), layer + "attn.c_attn.weight": (h, 3 * h),
                   layer + "attn.c_attn.bias": (3 * h,), layer + "attn.c_proj.weight": (h, h),
                   layer + "attn.c_proj.bias": (h,), layer + "mlp.c_fc.weight": (h, f), layer + "mlp.c_fc.bias": (f,),
                   layer + "mlp.c_proj.weight": (f, h), layer + "mlp.c_proj.bias": (h,)}
    return shapes


def check_hf_config(config: dict[str, Any], source: str) -> None:
    """Reject configs our GPT cannot reproduce exactly.

    Args:
        config: the parsed config.json.
        source: the file, for messages.

    Raises:
        HFConversionError: not a GPT-2, a field is missing, or a setting differs from GPT-2's.
    """
    model_type = config.get("model_type")
    if model_type != GPT2_MODEL_TYPE:
        raise HFConversionError(f"{source}: model_type is {model_type!r}, only {GPT2_MODEL_TYPE!r} "
                                f"({GPT2_ARCHITECTURE}) can be converted")
    for name in ("n_layer", "n_embd", "n_head", "n_positions", "vocab_size"):
        if not isinstance(config.get(name), int) or config[name] <= 0:
            raise HFConversionError(f"{source}: {name} must be a positive integer, found {config.get(name)!r}")
    if config["n_embd"] % config["n_head"]:
        raise HFConversionError(f"{source}: n_embd ({config['n_embd']}) is not divisible by "
                                f"n_head ({config['n_head']})")
    activation = config.get("activation_function", "gelu_new")
    if activation not in TANH_GELUS:
        raise HFConversionError(f"{source}: activation_function {activation!r} is not supported "
                                f"(our GPT uses the tanh GELU: {', '.join(TANH_GELUS)})")
    for name, value in _REQUIRED_SETTINGS.items():
        if config.get(name, value) != value:
            raise HFConversionError(f"{source}: {name}={config[name]!r} is not supported (GPT-2 uses {value!r})")
    check_model_sizes(config, source, HF_SPELLINGS, _parameters, ("n_layer", "n_embd", "n_inner", "vocab_size",
                      "n_positions"), ("n_layer",), defaults={"n_inner": MLP_WIDTH_FACTOR * config["n_embd"]})
    for name in ("bos_token_id", "eos_token_id"):
        check_token_id(source, name, config.get(name), config["vocab_size"])


# config.json keys -> the `train` config fields of the same meaning, whose types and ranges they get.
HF_SPELLINGS = {"n_layer": "num_layers", "n_embd": "hidden_size", "n_head": "num_attention_heads",
                "n_inner": "ffn_hidden_size", "n_positions": "max_position_embeddings", "resid_pdrop": "hidden_dropout",
                "embd_pdrop": "hidden_dropout", "attn_pdrop": "attention_dropout",
                "initializer_range": "init_method_std", "layer_norm_epsilon": "layernorm_epsilon"}
# GPT-2's MLP width when n_inner is null: 4 x n_embd.
MLP_WIDTH_FACTOR = 4


def _parameters(sizes: dict[str, int]) -> int:
    return transformer_parameters(sizes["n_layer"], sizes["n_embd"], sizes["n_inner"], sizes["vocab_size"],
                                  sizes["n_positions"])


def embedding_rows(vocab_size: int, padded_vocab_size: int | None) -> int:
    """Rows of our embedding for a Hugging Face model of ``vocab_size`` tokens: ``padded_vocab_size``, or the
    vocabulary itself when None.

    Raises:
        HFConversionError: ``padded_vocab_size`` is smaller than the vocabulary.
    """
    padded = vocab_size if padded_vocab_size is None else padded_vocab_size
    if padded < vocab_size:
        raise HFConversionError(f"padded vocabulary size {padded} is smaller than the model's vocab_size {vocab_size}")
    return padded


def shape_from_hf_config(config: dict[str, Any], padded_vocab_size: int | None = None) -> GPTShape:
    """Our model dimensions for a (checked) GPT-2 config; dropouts as in the config.

    Args:
        config: the parsed config.json.
        padded_vocab_size: rows of our embedding; default the config's ``vocab_size`` (no padding).
    """
    padded = embedding_rows(config["vocab_size"], padded_vocab_size)
    return GPTShape(num_layers=config["n_layer"], hidden_size=config["n_embd"], num_attention_heads=config["n_head"],
                    ffn_hidden_size=config.get("n_inner") or MLP_WIDTH_FACTOR * config["n_embd"],
                    max_position_embeddings=config["n_positions"], padded_vocab_size=padded,
                    hidden_dropout=config.get("resid_pdrop", 0.0), attention_dropout=config.get("attn_pdrop", 0.0),
                    init_method_std=config.get("initializer_range", 0.02),
                    layernorm_epsilon=config.get("layer_norm_epsilon", 1e-5))


def hf_config_from_shape(shape: GPTShape, vocab_size: int, eod_id: int | None) -> dict[str, Any]:
    """A config.json for ``GPT2LMHeadModel`` with our dimensions and ``vocab_size`` (padding stripped)."""
    return {"architectures": [GPT2_ARCHITECTURE], "model_type": GPT2_MODEL_TYPE, "n_layer": shape.num_layers,
            "n_embd": shape.hidden_size, "n_head": shape.num_attention_heads,
            "n_inner": None if shape.ffn_hidden_size == 4 * shape.hidden_size else shape.ffn_hidden_size,
            "n_positions": shape.max_position_embeddings, "vocab_size": vocab_size,
            "layer_norm_epsilon": shape.layernorm_epsilon, "initializer_range": shape.init_method_std,
            "resid_pdrop": shape.hidden_dropout, "embd_pdrop": shape.hidden_dropout,
            "attn_pdrop": shape.attention_dropout, "bos_token_id": eod_id, "eos_token_id": eod_id,
            "dtype": "float32", **_EXPORT_DEFAULTS}


def strip_hf_prefix(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """HF names without the ``transformer.`` prefix (old hub files have none; ``lm_head`` keeps its name)."""
    return {name.removeprefix(HF_PREFIX): tensor for name, tensor in tensors.items()}


def state_from_hf(tensors: dict[str, torch.Tensor], config: dict[str, Any], shape: GPTShape,
                  source: str) -> dict[str, torch.Tensor]:
    """HF GPT-2 weights -> our parameters (fp32, contiguous), vocabulary padded with zero rows.

    Args:
        tensors: the checkpoint's tensors, names with or without the ``transformer.`` prefix.
        config: the (checked) config.json the tensors belong to.
        shape: our model's dimensions (``padded_vocab_size`` >= the config's vocab_size).
        source: the directory or file, for messages.

    Returns:
        Parameter name -> tensor, the names of ``GPT(shape).named_parameters()`` (the tied head is
        ``tok_embeddings.weight``; with ``shape.fused_qkv`` one ``wqkv`` per block, rows per head).

    Raises:
        HFConversionError: a weight is missing, has another shape, or is not a GPT-2 weight.
    """
    weights = strip_hf_prefix(tensors)
    expected = hf_weight_shapes(config)
    for name, tensor in weights.items():
        if name in expected or _HF_BUFFER.match(name):
            continue
        if name == HF_HEAD:
            if "wte.weight" in weights and not torch.equal(tensor, weights["wte.weight"]):
                raise HFConversionError(f"{source}: {HF_HEAD} differs from transformer.wte.weight; our GPT ties "
                                        "the output head to the embedding")
            continue
        raise HFConversionError(f"{source}: unexpected tensor {name} of shape {tuple(tensor.shape)} "
                                "(not a GPT-2 LM weight)")
    for name, want in expected.items():
        if name not in weights:
            raise HFConversionError(f"{source}: missing tensor {HF_PREFIX}{name}")
        if tuple(weights[name].shape) != want:
            raise HFConversionError(f"{source}: tensor {HF_PREFIX}{name} has shape {tuple(weights[name].shape)}, "
                                    f"the config needs {want}")
    w = {name: t.to(torch.float32) for name, t in weights.items() if name in expected}
    h = shape.hidden_size
    vocab = config["vocab_size"]
    embedding = torch.zeros(shape.padded_vocab_size, h)
    embedding[:vocab] = w["wte.weight"]
    state = {"tok_embeddings.weight": embedding, "pos_embeddings.weight": w["wpe.weight"],
             "norm.weight": w["ln_f.weight"], "norm.bias": w["ln_f.bias"]}
    for i in range(shape.num_layers):
        for ours, hf in _hf_layer_names(i).items():
            state[ours] = w[hf].t() if _is_conv1d_weight(hf) else w[hf]
        qkv_weight, qkv_bias = w[f"h.{i}.attn.c_attn.weight"], w[f"h.{i}.attn.c_attn.bias"]
        for index, part in enumerate(("wq", "wk", "wv")):
            state[f"layers.{i}.attention.{part}.weight"] = qkv_weight[:, index * h:(index + 1) * h].t()
            state[f"layers.{i}.attention.{part}.bias"] = qkv_bias[index * h:(index + 1) * h]
    if shape.fused_qkv:
        # c_attn stacks q | k | v; our fused rows go per head, so split first and fuse our way.
        state = fuse_state(state, shape.num_attention_heads)
    return {name: t.contiguous().clone() for name, t in state.items()}


def state_to_hf(state: dict[str, torch.Tensor], num_layers: int, vocab_size: int) -> dict[str, torch.Tensor]:
    """Our parameters -> ``GPT2LMHeadModel`` tensors (``transformer.``-prefixed, tied head left out).

    Args:
        state: parameter name -> full (unsharded) tensor, as ``GPT.named_parameters()`` of an unfused
            GPT (what checkpoints hold; a fused state is split first with `trainer.models.gpt.fused_qkv.split_qkv`).
        num_layers: number of blocks.
        vocab_size: the real vocabulary size; padded embedding rows beyond it are dropped.
    """
    hf = {"wte.weight": state["tok_embeddings.weight"][:vocab_size], "wpe.weight": state["pos_embeddings.weight"],
          "ln_f.weight": state["norm.weight"], "ln_f.bias": state["norm.bias"]}
    for i in range(num_layers):
        for ours, name in _hf_layer_names(i).items():
            hf[name] = state[ours].t() if _is_conv1d_weight(name) else state[ours]
        attention = f"layers.{i}.attention."
        hf[f"h.{i}.attn.c_attn.weight"] = torch.cat([state[attention + f"{p}.weight"].t() for p in ("wq", "wk", "wv")],
                                                    dim=1)
        hf[f"h.{i}.attn.c_attn.bias"] = torch.cat([state[attention + f"{p}.bias"] for p in ("wq", "wk", "wv")])
    return {HF_PREFIX + name: t.contiguous().clone() for name, t in hf.items()}

