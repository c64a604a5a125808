"""Hugging Face Llama-class decoders <-> tokenmill GPT: config mapping, refusals and state-dict conversion.

``LlamaForCausalLM``, ``MistralForCausalLM``, ``Qwen2ForCausalLM``, ``Qwen3ForCausalLM`` and
``MixtralForCausalLM`` are our GPT decoder with its Llama-class options (`trainer.models.gpt.model.GPTShape`):
RMSNorm, SwiGLU, rotary positions, grouped-query attention, no biases (Qwen2: q/k/v biases; Qwen3: q/k
RMSNorm per head), tied or untied head, and for Mixtral a top-2 router over SwiGLU experts. The weights
are the same matrices under other names; Mixtral's per-expert ``[out, in]`` matrices are stacked into our
``[E, in, out]`` experts (`trainer.moe.experts.StackedWeight`). A config with a feature we do not
implement (a sliding window shorter than the model's positions, a rope type we lack, ...) is refused in
one line naming the field, never converted into a different model.

    check_llama_config(config, "llama/config.json")
    shape = shape_from_llama_config(config, padded_vocab_size=384)
    ours = state_from_llama(hf_tensors, config, shape, "llama/")   # names as GPT.named_parameters()
    hf_tensors = state_to_llama(ours, shape, vocab_size=300)      # names as save_pretrained writes them
    config = llama_config_from_shape(shape, 300, eod_id=2, model_type="llama")
"""

from __future__ import annotations

from typing import Any

import torch

from trainer.checkpoint.model_files import check_model_sizes, check_token_id
from trainer.checkpoint.model_memory import transformer_parameters
from trainer.config import ModelConfig, MoEConfig
from trainer.errors import HFConversionError
from trainer.models.gpt.fused_qkv import fuse_state
from trainer.models.gpt.hf import embedding_rows
from trainer.models.gpt.model import GPT, GPTShape
from trainer.moe.settings import TOP_K_CHOICES, MoESettings

# model_type -> the architecture transformers builds for it.
ARCHITECTURES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
                 "qwen3": "Qwen3ForCausalLM", "mixtral": "MixtralForCausalLM"}
LLAMA_MODEL_TYPES = tuple(ARCHITECTURES)
MOE_MODEL_TYPE = "mixtral"
# The defaults of each config class for the fields a hub config.json may leave out (transformers 4.x-5.x).
_ROPE_THETA = {"llama": 10000.0, "mistral": 10000.0, "qwen2": 10000.0, "qwen3": 10000.0, "mixtral": 1e6}
_RMS_NORM_EPS = {"llama": 1e-6, "mistral": 1e-6, "qwen2": 1e-6, "qwen3": 1e-6, "mixtral": 1e-5}
# The SwiGLU gate's activation in every one of these models.
SILU = "silu"
# Rope types we compute: none, positions / factor (linear), Llama 3.1's frequency scaling (llama3).
DEFAULT_ROPE, LINEAR_ROPE, LLAMA3_ROPE = "default", "linear", "llama3"
ROPE_TYPES = (DEFAULT_ROPE, LINEAR_ROPE, LLAMA3_ROPE)
# Llama 3.1's rope_scaling, which Megatron's --use-rope-scaling hard-codes (only the factor is a flag).
MEGATRON_LLAMA3_ROPE = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
# Attention layer kinds of a config's layer_types that are plain causal attention.
FULL_ATTENTION = "full_attention"
# config.json keys -> the `train` config fields of the same meaning, whose types and ranges they get.
HF_SPELLINGS = {"num_hidden_layers": "num_layers", "intermediate_size": "ffn_hidden_size",
                "rms_norm_eps": "layernorm_epsilon", "initializer_range": "init_method_std",
                "num_key_value_heads": "num_query_groups", "head_dim": "kv_channels",
                "num_local_experts": "num_experts", "num_experts_per_tok": "moe_router_topk",
                "router_aux_loss_coef": "moe_aux_loss_coeff"}
_REQUIRED_SIZES = ("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size", "vocab_size",
                   "max_position_embeddings")
# Our block module -> HF's, for the weights that only change names (no bias unless the shape has one).
_ATTENTION = {"wq": "q_proj", "wk": "k_proj", "wv": "v_proj", "wo": "o_proj"}
_MLP = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}
_NORMS = {"attention_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"}
_QK_NORMS = {"q_layernorm": "q_norm", "k_layernorm": "k_norm"}
# Mixtral's MoE block, its router and its experts' matrices (w1 gate, w3 up, w2 down: our names too).
_MOE_BLOCK = "block_sparse_moe"
HF_HEAD, HF_EMBEDDING = "lm_head.weight", "model.embed_tokens.weight"


def _where(config: dict[str, Any]) -> str:
    """Where a config keeps its rope settings: transformers 5's ``rope_parameters``, else ``rope_scaling``."""
    return "rope_parameters" if isinstance(config.get("rope_parameters"), dict) else "rope_scaling"


def _rope(config: dict[str, Any], source: str) -> dict[str, Any]:
    """The rope settings of a config: type, theta, scaling values (both spellings of transformers 4 and 5)."""
    key = _where(config)
    params = config.get(key) or {}
    if not isinstance(params, dict):
        raise HFConversionError(f"{source}: {key} must be an object or null, got {params!r}")
    theta = params.get("rope_theta", config.get("rope_theta", _ROPE_THETA[config["model_type"]]))
    kind = params.get("rope_type", params.get("type", DEFAULT_ROPE))
    if kind not in ROPE_TYPES:
        raise HFConversionError(f"{source}: {key}.rope_type {kind!r} is not supported (supported: "
                                f"{', '.join(ROPE_TYPES)})")
    if isinstance(theta, bool) or not isinstance(theta, (int, float)) or theta <= 1:
        raise HFConversionError(f"{source}: rope_theta={theta!r}: must be a number > 1")
    rope = {"type": kind, "theta": float(theta), "key": key,
            "partial": params.get("partial_rotary_factor", config.get("partial_rotary_factor", 1.0))}
    if kind == DEFAULT_ROPE:
        return rope
    for name in ("factor", *(MEGATRON_LLAMA3_ROPE if kind == LLAMA3_ROPE else ())):
        value = params.get(name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise HFConversionError(f"{source}: {key}.{name}={value!r}: must be a positive number")
        rope[name] = value
    return rope


def check_llama_config(config: dict[str, Any], source: str) -> None:
    """Reject Llama-class configs our GPT cannot reproduce exactly, naming the field.

    Args:
        config: the parsed config.json (``model_type`` one of `LLAMA_MODEL_TYPES`).
        source: the file, for messages.

    Raises:
        HFConversionError, ModelFileError: a missing or out-of-range size, or a feature we do not implement.
    """
    model_type = config.get("model_type")
    if model_type not in ARCHITECTURES:
        raise HFConversionError(f"{source}: model_type {model_type!r} is not one of {', '.join(ARCHITECTURES)}")
    for name in _REQUIRED_SIZES:
        if isinstance(config.get(name), bool) or not isinstance(config.get(name), int) or config[name] <= 0:
            raise HFConversionError(f"{source}: {name} must be a positive integer, found {config.get(name)!r}")
    if config.get("quantization_config") is not None:
        raise HFConversionError(f"{source}: quantization_config: quantized weights are not supported "
                                "(convert a float16/bfloat16/float32 checkpoint)")
    check_model_sizes(config, source, HF_SPELLINGS, _parameters, ("num_hidden_layers", "hidden_size",
                      "intermediate_size", "vocab_size", "num_local_experts"), ("num_hidden_layers",),
                      sections=(ModelConfig, MoEConfig))
    heads, groups = config["num_attention_heads"], _groups(config)
    if heads % groups:
        raise HFConversionError(f"{source}: num_key_value_heads={groups}: does not divide "
                                f"num_attention_heads={heads}")
    head_dim = _head_dim(config)
    if config.get("head_dim") is None and config["hidden_size"] % heads:
        raise HFConversionError(f"{source}: num_attention_heads={heads}: does not divide hidden_size="
                                f"{config['hidden_size']} (and no head_dim is given)")
    activation = config.get("hidden_act", SILU)
    if activation != SILU:
        raise HFConversionError(f"{source}: hidden_act {activation!r} is not supported (the SwiGLU of "
                                f"Llama-class models gates with {SILU!r})")
    _check_window(config, source)
    _check_biases(config, source)
    partial = _rope(config, source)["partial"]
    if (isinstance(partial, bool) or not isinstance(partial, (int, float)) or not 0 < partial <= 1
            or int(head_dim * partial) % 2):
        raise HFConversionError(f"{source}: partial_rotary_factor={partial!r}: must be in (0, 1] and "
                                f"rotate an even number of the {head_dim} channels of a head")
    if model_type == MOE_MODEL_TYPE:
        top_k = config.get("num_experts_per_tok", 2)
        if top_k not in TOP_K_CHOICES:
            raise HFConversionError(f"{source}: num_experts_per_tok={top_k!r}: must be one of {TOP_K_CHOICES}")
        jitter = config.get("router_jitter_noise", 0.0)
        if isinstance(jitter, bool) or not isinstance(jitter, (int, float)) or not 0 <= jitter < 1:
            raise HFConversionError(f"{source}: router_jitter_noise={jitter!r}: must be in [0, 1)")
        if top_k > config.get("num_local_experts", 8):
            raise HFConversionError(f"{source}: num_experts_per_tok={top_k}: more than num_local_experts="
                                    f"{config.get('num_local_experts', 8)}")
    for name in ("bos_token_id", "eos_token_id", "pad_token_id"):
        value = config.get(name)
        for token in value if isinstance(value, list) else [value]:
            check_token_id(source, name, token, config["vocab_size"])


def _check_window(config: dict[str, Any], source: str) -> None:
    """Refuse sliding-window attention that would cut a sequence the model can be given (positions past the
    window would attend to less than our causal attention gives them)."""
    limit = config["max_position_embeddings"]
    window = config.get("sliding_window")
    if window is None or (isinstance(window, int) and not isinstance(window, bool) and window >= limit):
        return
    # Mistral/Mixtral use a window whenever one is set; Qwen2/Qwen3 with use_sliding_window (transformers 4)
    # or in the layers their layer_types mark (transformers 5).
    sliding_layers = [kind for kind in config.get("layer_types") or [] if kind != FULL_ATTENTION]
    if config.get("use_sliding_window", True) or sliding_layers:
        raise HFConversionError(f"{source}: sliding_window={window!r}: sliding-window attention shorter than "
                                f"max_position_embeddings ({limit}) is not supported")


def _check_biases(config: dict[str, Any], source: str) -> None:
    """Our decoder has biases on every linear (add_bias_linear), on q/k/v only (add_qkv_bias), or none."""
    attention, mlp = bool(config.get("attention_bias", False)), bool(config.get("mlp_bias", False))
    if attention != mlp:
        given = "attention_bias" if attention else "mlp_bias"
        raise HFConversionError(f"{source}: {given}=true without {'mlp_bias' if attention else 'attention_bias'}"
                                "=true is not supported (biases go on every linear, on q/k/v only, or on none)")
    if config["model_type"] == "qwen2" and attention:
        raise HFConversionError(f"{source}: attention_bias=true is not a Qwen2 setting (Qwen2 has q/k/v biases only)")


def _groups(config: dict[str, Any]) -> int:
    return config.get("num_key_value_heads") or config["num_attention_heads"]


def _head_dim(config: dict[str, Any]) -> int:
    return config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]


def _parameters(sizes: dict[str, int]) -> int:
    return transformer_parameters(sizes["num_hidden_layers"], sizes["hidden_size"], sizes["intermediate_size"],
                                  sizes["vocab_size"], 0, sizes["num_local_experts"])


def _moe(config: dict[str, Any]) -> MoESettings | None:
    """Mixtral's router: softmax over the top-k logits (= softmax over all, top-k, renormalised), dropless."""
    if config["model_type"] != MOE_MODEL_TYPE:
        return None
    jitter = config.get("router_jitter_noise") or None
    return MoESettings(num_experts=config.get("num_local_experts", 8), top_k=config.get("num_experts_per_tok", 2),
                       pre_softmax=False, aux_loss_coeff=config.get("router_aux_loss_coef", 0.0) or 0.0,
                       input_jitter_eps=jitter)


def shape_from_llama_config(config: dict[str, Any], padded_vocab_size: int | None = None) -> GPTShape:
    """Our model dimensions and options for a (checked) Llama-class config.

    Args:
        config: the parsed config.json.
        padded_vocab_size: rows of our embedding; default the config's ``vocab_size`` (no padding).
    """
    padded = embedding_rows(config["vocab_size"], padded_vocab_size)
    rope = _rope(config, "config.json")
    model_type = config["model_type"]
    biases = bool(config.get("attention_bias", False))
    llama3 = rope["type"] == LLAMA3_ROPE
    return GPTShape(
        num_layers=config["num_hidden_layers"], hidden_size=config["hidden_size"],
        num_attention_heads=config["num_attention_heads"], ffn_hidden_size=config["intermediate_size"],
        max_position_embeddings=config["max_position_embeddings"], padded_vocab_size=padded,
        attention_dropout=config.get("attention_dropout", 0.0) or 0.0,
        init_method_std=config.get("initializer_range", 0.02),
        layernorm_epsilon=config.get("rms_norm_eps", _RMS_NORM_EPS[model_type]),
        normalization="RMSNorm", swiglu=True, position_embedding_type="rope",
        # An integral base as an int: what the flags give, and what model_config.json's check expects.
        rotary_base=int(rope["theta"]) if rope["theta"].is_integer() else rope["theta"],
        rotary_percent=float(rope["partial"]),
        rotary_interpolation_factor=float(rope["factor"]) if rope["type"] == LINEAR_ROPE else None,
        rope_scaling_factor=float(rope["factor"]) if llama3 else None,
        **({"rope_low_freq_factor": float(rope["low_freq_factor"]),
            "rope_high_freq_factor": float(rope["high_freq_factor"]),
            "rope_original_max_positions": int(rope["original_max_position_embeddings"])} if llama3 else {}),
        # None where the config's value is the multi-head default, as the flags leave them.
        num_query_groups=None if _groups(config) == config["num_attention_heads"] else _groups(config),
        kv_channels=None if _head_dim(config) * config["num_attention_heads"] == config["hidden_size"]
        else _head_dim(config),
        add_bias_linear=biases, add_qkv_bias=model_type == "qwen2", qk_layernorm=model_type == "qwen3",
        untie_embeddings_and_output_weights=not config.get("tie_word_embeddings", False), moe=_moe(config))


def check_flag_expressible(config: dict[str, Any], source: str) -> None:
    """Refuse the rope settings of a checked Llama-class config that Megatron's flags cannot express: ``train
    --load-hf`` builds its model from the flags (`trainer.config.ModelConfig`), so a value they would round
    or drop must not load silently into another model. ``convert-checkpoint --from-hf`` keeps them.

    Raises:
        HFConversionError: a non-integer rope_theta or linear factor, or Llama 3.1 constants other than
            Megatron's (`MEGATRON_LLAMA3_ROPE`).
    """
    rope = _rope(config, source)
    for name, value in MEGATRON_LLAMA3_ROPE.items():
        if rope["type"] == LLAMA3_ROPE and rope[name] != value:
            raise HFConversionError(f"{source}: {rope['key']}.{name}={rope[name]!r}: train takes Llama 3.1's "
                                    f"{value} (Megatron's --use-rope-scaling); convert-checkpoint --from-hf keeps it")
    if rope["type"] == LINEAR_ROPE and rope["factor"] != int(rope["factor"]):
        raise HFConversionError(f"{source}: {rope['key']}.factor={rope['factor']!r}: train's "
                                "--rotary-seq-len-interpolation-factor is an integer; convert-checkpoint --from-hf "
                                "keeps it")
    if rope["theta"] != int(rope["theta"]):
        raise HFConversionError(f"{source}: rope_theta={rope['theta']!r}: train's --rotary-base is an integer; "
                                "convert-checkpoint --from-hf keeps it")


def export_model_type(shape: GPTShape, recorded: str | None = None) -> str:
    """The HF ``model_type`` a GPT shape with Llama-class options is written as: the one it was imported from
    when that one expresses it, else Mixtral for experts, Qwen3 for q/k norms, Qwen2 for q/k/v biases, Llama.

    Raises:
        HFConversionError: options no Llama-class architecture has (LayerNorm, GELU, learned positions,
            zero-centred norms are converted; those are not).
    """
    problems = [(shape.normalization != "RMSNorm", f"normalization {shape.normalization}"),
                (not shape.swiglu, "a GELU MLP"), (shape.position_embedding_type != "rope",
                                                   f"position_embedding_type {shape.position_embedding_type}"),
                (shape.add_qkv_bias and shape.qk_layernorm, "q/k/v biases with q/k norms"),
                (shape.add_bias_linear and (shape.add_qkv_bias or shape.moe is not None), "these biases"),
                (shape.moe is not None and (shape.qk_layernorm or shape.add_qkv_bias), "experts with q/k options"),
                (shape.moe is not None and (shape.moe.layer_freq != 1 or shape.moe.layer_offset != 0),
                 "experts in some layers only"),
                (shape.moe is not None and (shape.moe.pre_softmax or shape.moe.capacity_factor is not None
                                            or shape.moe.expert_capacity is not None), "this routing")]
    for fails, what in problems:
        if fails:
            raise HFConversionError(f"a GPT with {what} has no Hugging Face Llama-class architecture")
    if shape.moe is not None:
        return MOE_MODEL_TYPE
    if shape.qk_layernorm:
        return "qwen3"
    if shape.add_qkv_bias:
        return "qwen2"
    return recorded if recorded in ("llama", "mistral") else "llama"


def llama_config_from_shape(shape: GPTShape, vocab_size: int, eod_id: int | None, model_type: str) -> dict[str, Any]:
    """A config.json for ``model_type`` (`export_model_type`) with our dimensions and ``vocab_size``."""
    rope: dict[str, Any] = {"rope_theta": shape.rotary_base, "rope_type": DEFAULT_ROPE}
    if shape.rotary_interpolation_factor is not None:
        rope = {**rope, "rope_type": LINEAR_ROPE, "factor": shape.rotary_interpolation_factor}
    if shape.rope_scaling_factor is not None:
        rope = {**rope, "rope_type": LLAMA3_ROPE, "factor": shape.rope_scaling_factor,
                "low_freq_factor": shape.rope_low_freq_factor, "high_freq_factor": shape.rope_high_freq_factor,
                "original_max_position_embeddings": shape.rope_original_max_positions}
    if shape.rotary_percent != 1.0:
        rope["partial_rotary_factor"] = shape.rotary_percent
    config = {"architectures": [ARCHITECTURES[model_type]], "model_type": model_type,
              "vocab_size": vocab_size, "hidden_size": shape.hidden_size, "intermediate_size": shape.ffn_hidden_size,
              "num_hidden_layers": shape.num_layers, "num_attention_heads": shape.num_attention_heads,
              "num_key_value_heads": shape.query_groups, "head_dim": shape.head_dim, "hidden_act": SILU,
              "max_position_embeddings": shape.max_position_embeddings, "initializer_range": shape.init_method_std,
              "rms_norm_eps": shape.layernorm_epsilon, "attention_dropout": shape.attention_dropout,
              "tie_word_embeddings": not shape.untie_embeddings_and_output_weights,
              # Both spellings: transformers 5 reads rope_parameters, 4.x rope_theta and rope_scaling.
              "rope_parameters": rope, "rope_theta": shape.rotary_base,
              "rope_scaling": None if rope["rope_type"] == DEFAULT_ROPE else rope,
              "bos_token_id": None, "eos_token_id": eod_id, "use_cache": True, "dtype": "float32"}
    if model_type in ("llama", "qwen3"):
        config["attention_bias"] = shape.add_bias_linear
    if model_type == "llama":
        config["mlp_bias"] = shape.add_bias_linear
    if model_type in ("mistral", MOE_MODEL_TYPE):
        config["sliding_window"] = None
    if model_type in ("qwen2", "qwen3"):
        config["use_sliding_window"] = False
    if shape.moe is not None:
        config |= {"num_local_experts": shape.moe.num_experts, "num_experts_per_tok": shape.moe.top_k,
                   "router_aux_loss_coef": shape.moe.aux_loss_coeff,
                   "router_jitter_noise": shape.moe.input_jitter_eps or 0.0, "output_router_logits": False}
    return config


def _hf_names(shape: GPTShape) -> dict[str, str]:
    """Our parameter name -> HF name of every tensor that only changes name (not the vocabulary rows, not
    the experts)."""
    names = {"norm.weight": "model.norm.weight"}
    for i in range(shape.num_layers):
        ours, hf = f"layers.{i}.", f"model.layers.{i}."
        names |= {f"{ours}{o}.weight": f"{hf}{h}.weight" for o, h in _NORMS.items()}
        for o, h in _ATTENTION.items():
            names[f"{ours}attention.{o}.weight"] = f"{hf}self_attn.{h}.weight"
            if shape.add_bias_linear or (shape.add_qkv_bias and o != "wo"):
                names[f"{ours}attention.{o}.bias"] = f"{hf}self_attn.{h}.bias"
        if shape.qk_layernorm:
            names |= {f"{ours}attention.{o}.weight": f"{hf}self_attn.{h}.weight" for o, h in _QK_NORMS.items()}
        if shape.moe is not None and shape.moe.is_moe_layer(i):
            names[f"{ours}feed_forward.router.weight"] = f"{hf}{_MOE_BLOCK}.gate.weight"
            continue
        for o, h in _MLP.items():
            names[f"{ours}feed_forward.{o}.weight"] = f"{hf}mlp.{h}.weight"
            if shape.add_bias_linear:
                names[f"{ours}feed_forward.{o}.bias"] = f"{hf}mlp.{h}.bias"
    return names


def _is_norm(name: str) -> bool:
    return name.endswith(("norm.weight", "layernorm.weight"))


def _expert_names(shape: GPTShape) -> list[tuple[str, int, str, str]]:
    """(our stacked parameter, expert, matrix, HF name) of every expert matrix."""
    if shape.moe is None:
        return []
    return [(f"layers.{i}.feed_forward.experts.{w}.weight", e, w,
             f"model.layers.{i}.{_MOE_BLOCK}.experts.{e}.{w}.weight")
            for i in range(shape.num_layers) if shape.moe.is_moe_layer(i)
            for e in range(shape.moe.num_experts) for w in ("w1", "w2", "w3")]


def state_from_llama(tensors: dict[str, torch.Tensor], config: dict[str, Any], shape: GPTShape,
                     source: str) -> dict[str, torch.Tensor]:
    """HF Llama-class weights -> our parameters (fp32, contiguous), vocabulary padded with zero rows.

    Args:
        tensors: the checkpoint's tensors as ``save_pretrained`` writes them.
        config: the (checked) config.json the tensors belong to.
        shape: our model's options and dimensions (``padded_vocab_size`` >= the config's vocab_size); with
            ``apply_layernorm_1p`` the norm weights are stored less one.
        source: the directory, for messages.

    Returns:
        Parameter name -> tensor, the names of ``GPT(shape).named_parameters()`` (a tied head once, as
        ``tok_embeddings.weight``; with ``shape.fused_qkv`` one ``wqkv`` per block).

    Raises:
        HFConversionError: a weight is missing, has another shape, or is not one of the model's.
    """
    names = _hf_names(shape)
    experts = _expert_names(shape)
    vocab, hidden = config["vocab_size"], shape.hidden_size
    expected = {HF_EMBEDDING: (vocab, hidden)}
    if shape.untie_embeddings_and_output_weights:
        expected[HF_HEAD] = (vocab, hidden)
    known = set(expected) | set(names.values()) | {hf for *_, hf in experts}
    for name, tensor in tensors.items():
        if name in known or name.endswith("rotary_emb.inv_freq"):  # old files saved the rotary buffer
            continue
        if name == HF_HEAD:  # a tied head saved anyway
            if HF_EMBEDDING in tensors and not torch.equal(tensor, tensors[HF_EMBEDDING]):
                raise HFConversionError(f"{source}: {HF_HEAD} differs from {HF_EMBEDDING} but the config ties "
                                        "them (tie_word_embeddings)")
            continue
        raise HFConversionError(f"{source}: unexpected tensor {name} of shape {tuple(tensor.shape)} (not a "
                                f"{ARCHITECTURES[config['model_type']]} weight of this config)")
    for name in sorted(known):
        if name not in tensors:
            raise HFConversionError(f"{source}: missing tensor {name}")
    for name, want in expected.items():
        if tuple(tensors[name].shape) != want:
            raise HFConversionError(f"{source}: tensor {name} has shape {tuple(tensors[name].shape)}, the config "
                                    f"needs {want}")
    with torch.device("meta"):
        sizes = {name: tuple(p.shape) for name, p in GPT(shape.unfused()).named_parameters()}
    state: dict[str, torch.Tensor] = {}
    for ours, hf in names.items():
        state[ours] = _checked(tensors[hf], sizes[ours], hf, source) - (1.0 if shape.apply_layernorm_1p and
                                                                        _is_norm(ours) else 0.0)
    for ours, hf in (("tok_embeddings.weight", HF_EMBEDDING), ("output.weight", HF_HEAD)):
        if ours in sizes and (ours == "tok_embeddings.weight" or shape.untie_embeddings_and_output_weights):
            rows = torch.zeros(shape.padded_vocab_size, hidden)
            rows[:vocab] = tensors[hf].to(torch.float32)
            state[ours] = rows
    for ours, expert, matrix, hf in experts:
        stacked = state.setdefault(ours, torch.empty(sizes[ours]))
        stacked[expert] = _checked(tensors[hf], sizes[ours][:0:-1], hf, source).t()
    if shape.fused_qkv:
        state = fuse_state(state, shape.num_attention_heads, shape.query_groups)
    return {name: t.contiguous().clone() for name, t in state.items()}


def _checked(tensor: torch.Tensor, want: tuple[int, ...], name: str, source: str) -> torch.Tensor:
    """``tensor`` in float32 when its shape is ``want``."""
    if tuple(tensor.shape) != tuple(want):
        raise HFConversionError(f"{source}: tensor {name} has shape {tuple(tensor.shape)}, the config needs "
                                f"{tuple(want)}")
    return tensor.to(torch.float32)


def state_to_llama(state: dict[str, torch.Tensor], shape: GPTShape, vocab_size: int) -> dict[str, torch.Tensor]:
    """Our parameters (unfused, full size) -> the tensors ``save_pretrained`` writes for the Llama-class model
    of `export_model_type` (padded vocabulary rows dropped, a tied head left out, experts unstacked)."""
    hf = {HF_EMBEDDING: state["tok_embeddings.weight"][:vocab_size]}
    if shape.untie_embeddings_and_output_weights:
        hf[HF_HEAD] = state["output.weight"][:vocab_size]
    for ours, name in _hf_names(shape).items():
        hf[name] = state[ours] + (1.0 if shape.apply_layernorm_1p and _is_norm(ours) else 0.0)
    for ours, expert, _, name in _expert_names(shape):
        hf[name] = state[ours][expert].t()
    return {name: t.contiguous().clone() for name, t in hf.items()}

