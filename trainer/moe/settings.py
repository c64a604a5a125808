"""`MoESettings`: what makes a family's feed-forward layers mixtures of experts (part of its resolved shape)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from trainer.errors import TrainConfigError
from trainer.moe.router import LOAD_BALANCING_TYPES, ROUTER_DTYPES

if TYPE_CHECKING:  # annotation only: trainer.config imports the model registry, whose families import this
    from trainer.config import MoEConfig

# Megatron's --moe-router-topk: top-1 (Switch) and top-2 (GShard) are the routings we implement.
TOP_K_CHOICES = (1, 2)


@dataclass(frozen=True, slots=True)
class MoESettings:
    """Router, capacity and placement of the expert layers (Megatron's ``--moe-*`` flags)."""

    num_experts: int
    """Experts per MoE layer (all expert-parallel ranks together)."""
    top_k: int = 2
    """Experts each token is sent to (1: Switch, 2: GShard/Megatron's default)."""
    pre_softmax: bool = False
    """Softmax over all experts, then top-k (weights not renormalised: Switch); else top-k of the logits,
    then softmax over the k chosen (Megatron's default)."""
    aux_loss_coeff: float = 0.0
    """Weight of the Switch/GShard load-balancing loss E * sum_e f_e P_e added to the training loss."""
    z_loss_coeff: float = 0.0
    """Weight of the router z-loss mean(logsumexp(logits)^2) (ST-MoE) added to the training loss."""
    capacity_factor: float | None = None
    """Tokens an expert takes per micro-batch: ceil(factor x tokens x top_k / experts); assignments past it are
    dropped (the token's residual passes through). None: dropless."""
    expert_capacity: int | None = None
    """Assignments an expert takes per sequence, counted in token order (Hugging Face Switch Transformers'
    ``expert_capacity``): a sequence's later tokens past it are dropped. Exclusive with ``capacity_factor``."""
    layer_freq: int = 1
    """Every k-th feed-forward layer is a MoE layer, from layer ``layer_offset`` (Megatron's --moe-layer-freq)."""
    layer_offset: int = 0
    """The first MoE layer (0: Megatron's placement; Switch Transformers' sparse layers start at 1)."""
    input_jitter_eps: float | None = None
    """Training only: the router sees its input times uniform(1 - eps, 1 + eps) noise (Switch's, DeepSpeed's
    ``noisy_gate_policy='Jitter'``, Megatron's --moe-input-jitter-eps); the experts see the input unchanged."""
    load_balancing_type: str = "aux_loss"
    """aux_loss: the load-balancing loss over all the micro-batch's tokens; seq_aux_loss: the mean over its
    sequences of each sequence's own (DeepSeek-V2, Megatron's sequence_load_balancing_loss_func); none: none."""
    router_dtype: str = "fp32"
    """What the router computes in: fp32, or fp64 (Megatron's --moe-router-dtype)."""
    ffn_hidden_size: int | None = None
    """Width of each expert's MLP (Megatron's --moe-ffn-hidden-size); None: the dense MLP's."""
    per_layer_logging: bool = False
    """Report each MoE layer's auxiliary losses under its own name too (Megatron's --moe-per-layer-logging)."""

    def __post_init__(self) -> None:
        if self.top_k not in TOP_K_CHOICES:
            raise ValueError(f"top_k must be one of {TOP_K_CHOICES}, got {self.top_k}")
        if self.top_k > self.num_experts:
            raise ValueError(f"top_k ({self.top_k}) exceeds num_experts ({self.num_experts})")
        if self.capacity_factor is not None and self.expert_capacity is not None:
            raise ValueError(f"capacity_factor ({self.capacity_factor}) and expert_capacity ({self.expert_capacity}) "
                             "exclude each other")
        for name, choices in (("load_balancing_type", LOAD_BALANCING_TYPES), ("router_dtype", ROUTER_DTYPES)):
            if getattr(self, name) not in choices:
                raise ValueError(f"{name} must be one of {', '.join(choices)}, got {getattr(self, name)!r}")

    def expert_width(self, dense_ffn_hidden_size: int) -> int:
        """Width of each expert's MLP: ``ffn_hidden_size``, else the dense MLP's."""
        return self.ffn_hidden_size or dense_ffn_hidden_size

    def is_moe_layer(self, index: int) -> bool:
        """Whether feed-forward layer ``index`` (0-based, within its stack) is a MoE layer."""
        return index >= self.layer_offset and (index - self.layer_offset) % self.layer_freq == 0

    def same_parameters(self, other: MoESettings | None) -> bool:
        """Whether a model with ``other`` holds the same expert parameters (experts and MoE layers; routing
        and capacity do not change a parameter)."""
        return other is not None and (self.num_experts, self.layer_freq, self.layer_offset, self.ffn_hidden_size) == (
            other.num_experts, other.layer_freq, other.layer_offset, other.ffn_hidden_size)


# `MoESettings` field -> the `trainer.config.MoEConfig` field (the flag) that sets it.
MOE_CONFIG_NAMES = {"num_experts": "num_experts", "top_k": "moe_router_topk", "pre_softmax": "moe_router_pre_softmax",
                    "aux_loss_coeff": "moe_aux_loss_coeff", "z_loss_coeff": "moe_z_loss_coeff",
                    "capacity_factor": "moe_expert_capacity_factor", "expert_capacity": "moe_expert_capacity",
                    "layer_freq": "moe_layer_freq", "layer_offset": "moe_layer_offset",
                    "input_jitter_eps": "moe_input_jitter_eps",
                    "load_balancing_type": "moe_router_load_balancing_type", "router_dtype": "moe_router_dtype",
                    "ffn_hidden_size": "moe_ffn_hidden_size", "per_layer_logging": "moe_per_layer_logging"}


def moe_settings(moe: MoEConfig) -> MoESettings | None:
    """The settings a `trainer.config.MoEConfig` section gives a family's shape; None for a dense model."""
    if moe.num_experts is None:
        return None
    return MoESettings(**{name: getattr(moe, config_name) for name, config_name in MOE_CONFIG_NAMES.items()})


def moe_config_fields(settings: MoESettings | None) -> dict[str, Any]:
    """The `trainer.config.MoEConfig` fields that give ``settings`` back (`moe_settings`'s inverse; all unset
    for a dense model): what ``train --load`` / ``--load-hf`` take from a MoE checkpoint as defaults."""
    if settings is None:
        return {"num_experts": None}
    return {config_name: getattr(settings, name) for name, config_name in MOE_CONFIG_NAMES.items()}


def expert_layout(settings: MoESettings | None) -> str:
    """What a model's expert parameters look like, in words (for messages)."""
    if settings is None:
        return "none (dense)"
    return (f"{settings.num_experts} per MoE layer, every {settings.layer_freq} layer(s) from layer "
            f"{settings.layer_offset}")


def moe_settings_from_json(value: dict[str, Any] | None) -> MoESettings | None:
    """The settings a model_config.json ``shape.moe`` holds (``dataclasses.asdict`` of them; None: dense).

    Raises:
        TypeError, ValueError: not the fields of `MoESettings`, or values it refuses.
    """
    if value is None:
        return None
    if not isinstance(value, dict):
        raise TypeError(f"moe must be an object or null, got {value!r}")
    return MoESettings(**value)


def check_family_has_experts(num_experts: int | None, shape: object, family: str) -> None:
    """Refuse experts for a family whose shape has no ``moe`` field (its MLPs would silently stay dense).

    Raises:
        TrainConfigError: ``num_experts`` is set and the family's shape cannot hold them.
    """
    if num_experts is not None and not hasattr(shape, "moe"):
        raise TrainConfigError(f"num_experts ({num_experts}): model {family} has no mixture-of-experts variant")
