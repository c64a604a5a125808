"""Hugging Face Switch Transformers (``SwitchTransformersForConditionalGeneration``, model_type
"switch_transformers") as a T5 with experts: its config and expert tensors <-> our `MoESettings` and stacked
expert weights. The rest of the model (attention, norms, embeddings, head) is T5 v1.0's (`trainer.models.t5.hf`).

How Switch's router maps onto `trainer.moe` (transformers' ``SwitchTransformersTop1Router``):

- top-1 of the softmax over all experts, the gate being that probability (``top_k=1, pre_softmax=True``),
  logits and softmax in float32 (``router_dtype`` "float32"; other dtypes are refused: ours is always float32);
- ``expert_capacity`` is per sequence and absolute: a sequence's tokens claim their expert in token order and
  the ones past the capacity are dropped (output zero, the residual carries them), in training and inference
  alike (`MoESettings.expert_capacity`). Right padding comes after every real token, so it never displaces one;
- sparse layers are ``i % step == 1`` (every layer when the step is 1), step = layers // sparse layers:
  ``layer_freq=step, layer_offset=1`` (0 when the step is 1); encoder and decoder must share the step;
- ``router_jitter_noise`` multiplies the router's input only (``input_jitter_eps``). transformers' float32
  router multiplies its input tensor in place, so its experts see the noise too in training: a side effect of
  ``Tensor.to`` returning the same tensor, not the Switch paper's jitter, and not copied;
- ``router_aux_loss_coef`` / ``router_z_loss_coef`` are the coefficients of our per-layer losses, summed over
  the MoE layers (Megatron's convention). transformers' loss (``output_router_logits``) averages them over the
  layers of a stack instead, and leaves them out when the step is 1; only the training loss differs, not logits.

Expert e's ``wi`` [d_ff, d_model] / ``wo`` [d_model, d_ff] (``nn.Linear`` weights) are row e of our
``experts.w1`` [E, d_model, d_ff] / ``experts.w2`` [E, d_ff, d_model], transposed.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from trainer.errors import HFConversionError
from trainer.moe.settings import MoESettings

logger = logging.getLogger(__name__)

SWITCH_MODEL_TYPE = "switch_transformers"
SWITCH_ARCHITECTURE = "SwitchTransformersForConditionalGeneration"
# The only router and MLP variants the conversion maps exactly (see the module docstring).
ROUTER_DTYPE = "float32"
ACTIVATION = "relu"
# transformers always applies a capacity; a dropless model is exported with one no sequence reaches.
DROPLESS_CAPACITY = 2**31 - 1
# Our stacked expert weights -> the per-expert Linear of transformers' DenseActDense.
_EXPERT_WEIGHTS = {"w1": "wi", "w2": "wo"}


def feed_forward_prefixes(num_encoder_layers: int, num_decoder_layers: int) -> list[tuple[int, str, str]]:
    """(layer index in its stack, our MLP module name, transformers' MLP layer prefix) of every block."""
    encoder = [(i, f"encoder_layers.{i}.feed_forward", f"encoder.block.{i}.layer.1") for i in range(num_encoder_layers)]
    decoder = [(i, f"decoder_layers.{i}.feed_forward", f"decoder.block.{i}.layer.2") for i in range(num_decoder_layers)]
    return encoder + decoder


def _sparse_step(layers: int, sparse_layers: int, stack: str, source: str) -> int:
    if sparse_layers <= 0:
        # transformers' "HACK" for 0 sparse layers still makes layer 1 sparse: nothing to import faithfully.
        raise HFConversionError(f"{source}: num_sparse_{stack}_layers {sparse_layers}: a Switch Transformers "
                                "stack without sparse layers is not supported (convert it as a t5)")
    if sparse_layers > layers:
        # transformers' step layers // sparse_layers is then 0: no layer is sparse.
        raise HFConversionError(f"{source}: num_sparse_{stack}_layers={sparse_layers}: more than the {layers} "
                                f"layers of the {stack}")
    return layers // sparse_layers


def moe_from_switch_config(config: dict[str, Any], source: str) -> MoESettings:
    """Our `MoESettings` of a switch_transformers config.json.

    Raises:
        HFConversionError: a router or layer placement that `trainer.moe` does not compute the same way.
    """
    if config.get("router_bias", False):
        raise HFConversionError(f"{source}: router_bias true is not supported (our router has no bias)")
    if config.get("router_dtype", ROUTER_DTYPE) != ROUTER_DTYPE:
        raise HFConversionError(f"{source}: router_dtype {config['router_dtype']!r} is not supported (our router "
                                f"computes in {ROUTER_DTYPE})")
    if config.get("dense_act_fn", ACTIVATION) != ACTIVATION:
        raise HFConversionError(f"{source}: dense_act_fn {config['dense_act_fn']!r} is not supported "
                                f"(only {ACTIVATION!r})")
    encoder_layers = config["num_layers"]
    decoder_layers = config.get("num_decoder_layers") or encoder_layers
    encoder_step = _sparse_step(encoder_layers, config.get("num_sparse_encoder_layers", 3), "encoder", source)
    decoder_step = _sparse_step(decoder_layers, config.get("num_sparse_decoder_layers", 3), "decoder", source)
    if encoder_step != decoder_step:
        raise HFConversionError(f"{source}: encoder and decoder sparse steps differ ({encoder_step} and "
                                f"{decoder_step}); our T5 places experts alike in both stacks")
    jitter = config.get("router_jitter_noise", 0.0)
    return MoESettings(num_experts=config.get("num_experts", 8), top_k=1, pre_softmax=True,
                       aux_loss_coeff=config.get("router_aux_loss_coef", 0.0),
                       z_loss_coeff=config.get("router_z_loss_coef", 0.0),
                       expert_capacity=config.get("expert_capacity", 64), layer_freq=encoder_step,
                       layer_offset=1 if encoder_step > 1 else 0, input_jitter_eps=jitter or None)


def _sparse_layers(moe: MoESettings, layers: int, stack: str) -> int:
    """transformers' num_sparse_{stack}_layers giving exactly our MoE layers of a ``layers``-layer stack."""
    wanted = [i for i in range(layers) if moe.is_moe_layer(i)]
    count = max(len(wanted), 1)
    step = layers // count
    theirs = [i for i in range(layers) if i % step == 1 or step == 1]
    if theirs != wanted:
        raise HFConversionError(f"MoE layers {wanted} of the {stack} cannot be Switch Transformers' sparse layers "
                                f"(they are every step-th layer from 1; the nearest is {theirs})")
    return count


def switch_config_fields(moe: MoESettings, num_encoder_layers: int, num_decoder_layers: int) -> dict[str, Any]:
    """The switch_transformers config.json fields of our experts (the T5 fields come from `hf_t5_config`).

    Raises:
        HFConversionError: routing that transformers' Switch router cannot express.
    """
    if (moe.top_k, moe.pre_softmax) != (1, True):
        raise HFConversionError(f"Switch Transformers route top-1 of the softmax over all experts; this model "
                                f"routes top-{moe.top_k}{' (pre-softmax)' if moe.pre_softmax else ''}")
    if moe.capacity_factor is not None:
        raise HFConversionError(f"capacity factor {moe.capacity_factor} has no Switch Transformers equivalent "
                                "(its expert_capacity is a fixed number of tokens per sequence)")
    capacity = moe.expert_capacity
    if capacity is None:
        logger.info("dropless experts exported with expert_capacity %d (no sequence reaches it)", DROPLESS_CAPACITY)
        capacity = DROPLESS_CAPACITY
    return {"architectures": [SWITCH_ARCHITECTURE], "model_type": SWITCH_MODEL_TYPE, "num_experts": moe.num_experts,
            "expert_capacity": capacity,
            "num_sparse_encoder_layers": _sparse_layers(moe, num_encoder_layers, "encoder"),
            "num_sparse_decoder_layers": _sparse_layers(moe, num_decoder_layers, "decoder"),
            "router_bias": False, "router_dtype": ROUTER_DTYPE, "router_jitter_noise": moe.input_jitter_eps or 0.0,
            "router_ignore_padding_tokens": False, "router_aux_loss_coef": moe.aux_loss_coeff,
            "router_z_loss_coef": moe.z_loss_coeff, "dense_act_fn": ACTIVATION}


def expert_tensor_names(moe: MoESettings, num_encoder_layers: int, num_decoder_layers: int,
                        ) -> dict[str, list[str]]:
    """Our stacked expert weight name -> transformers' per-expert tensor names, in expert order."""
    names = {}
    for index, ours, hf in feed_forward_prefixes(num_encoder_layers, num_decoder_layers):
        if moe.is_moe_layer(index):
            for weight, linear in _EXPERT_WEIGHTS.items():
                names[f"{ours}.experts.{weight}.weight"] = [f"{hf}.mlp.experts.expert_{e}.{linear}.weight"
                                                            for e in range(moe.num_experts)]
    return names


def stack_experts(tensors: dict[str, torch.Tensor], names: dict[str, list[str]]) -> dict[str, torch.Tensor]:
    """Our stacked expert weights [E, in, out] from transformers' per-expert [out, in] tensors (all present)."""
    return {ours: torch.stack([tensors[hf].t() for hf in theirs]) for ours, theirs in names.items()}


def unstack_experts(state: dict[str, torch.Tensor], names: dict[str, list[str]]) -> dict[str, torch.Tensor]:
    """transformers' per-expert [out, in] tensors from our stacked [E, in, out] ones."""
    return {hf: state[ours][e].t().contiguous() for ours, theirs in names.items() for e, hf in enumerate(theirs)}
