"""AdamW with Megatron's parameter groups, the learning-rate schedule, and fp16 dynamic loss scaling."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from trainer.config import OptimizerConfig, PrecisionConfig

# Megatron's DynamicGradScaler constants: double after a clean window, halve after hysteresis overflows.
LOSS_SCALE_GROWTH_FACTOR = 2.0
LOSS_SCALE_BACKOFF_FACTOR = 0.5


# AdamW's update kernels, fastest first: one fused kernel over all parameters (CUDA), multi-tensor
# (``_foreach_*``) kernels, one loop iteration per parameter. -> `torch.optim.AdamW` keyword arguments.
ADAMW_KERNEL_OPTIONS: dict[str, dict[str, bool]] = {
    "fused": {"fused": True},
    "foreach": {"foreach": True},
    "for-loop": {"foreach": False},
}


def select_adamw_kernel(device_type: str, params: Iterable[torch.Tensor]) -> str:
    """The fastest AdamW kernel (a key of `ADAMW_KERNEL_OPTIONS`) that ``params`` allow on ``device_type``.

    "fused" on CUDA, "foreach" on other devices, when the parameters are all plain tensors or all
    DTensors on one device mesh; "for-loop" when they mix plain tensors and DTensors (tensor
    parallelism leaves norm weights plain) or DTensors on different meshes (tensor parallelism under
    FSDP2): the multi-tensor and fused kernels take one list per call and reject such lists.
    """
    meshes = {p.device_mesh if isinstance(p, DTensor) else None for p in params}
    if len(meshes) > 1:
        return "for-loop"
    return "fused" if device_type == "cuda" else "foreach"


def build_optimizer(named_params: list[tuple[str, nn.Parameter]], config: OptimizerConfig,
                    foreach: bool | None = None, fused: bool | None = None,
                    decayed: frozenset[str] | None = None) -> torch.optim.AdamW:
    """AdamW over ``named_params``; biases and norm weights (every 1-D parameter) get no weight decay.

    Args:
        named_params: the parameters this rank optimises, with their full-model names.
        config: optimiser settings.
        foreach: use the multi-tensor kernels (None: PyTorch's default, the for-loop on a CPU).
        fused: use the fused kernel (CUDA). `select_adamw_kernel` says which of the two the parameters
            allow (``**ADAMW_KERNEL_OPTIONS[kernel]``).
        decayed: the names that get weight decay, when the tensors stepped are not the model's own
            (`trainer.zero.ShardedAdamW` steps 1-D slices); default: the parameters of 2 or more dims.
    """
    named_params = list(named_params)  # callers may pass a generator: it is read twice
    if decayed is None:
        decayed = frozenset(name for name, p in named_params if p.ndim >= 2)
    decay = [p for name, p in named_params if name in decayed]
    no_decay = [p for name, p in named_params if name not in decayed]
    groups = [{"params": decay, "weight_decay": config.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=config.lr, betas=(config.adam_beta1, config.adam_beta2),
                             eps=config.adam_eps, foreach=foreach, fused=fused)


def init_optimizer_state(optimizer: torch.optim.AdamW) -> None:
    """Create AdamW's per-parameter state (zero moments, step 0) before the first step, as
    ``AdamW.step`` would, so a checkpoint can be loaded into it in place."""
    for group in optimizer.param_groups:
        for p in group["params"]:
            if not optimizer.state[p]:
                optimizer.state[p] = {"step": torch.tensor(0.0),
                                      "exp_avg": torch.zeros_like(p, memory_format=torch.preserve_format),
                                      "exp_avg_sq": torch.zeros_like(p, memory_format=torch.preserve_format)}


@dataclass(frozen=True, slots=True)
class LRSchedule:
    """Megatron's annealing: linear warm-up to ``max_lr``, then constant/linear/cosine decay to ``min_lr``."""

    max_lr: float
    min_lr: float
    warmup_iters: int
    decay_iters: int
    style: str

    @classmethod
    def from_config(cls, config: OptimizerConfig, train_iters: int) -> LRSchedule:
        warmup, decay_iters = config.schedule_iters(train_iters)
        return cls(max_lr=config.lr, min_lr=config.min_lr, warmup_iters=warmup, decay_iters=decay_iters,
                   style=config.lr_decay_style)

    def __call__(self, iteration: int) -> float:
        """Learning rate of optimiser step ``iteration`` (1-based)."""
        if self.warmup_iters > 0 and iteration <= self.warmup_iters:
            return self.max_lr * iteration / self.warmup_iters
        if self.style == "constant":
            return self.max_lr
        if iteration >= self.decay_iters:
            return self.min_lr
        ratio = (iteration - self.warmup_iters) / (self.decay_iters - self.warmup_iters)
        coeff = 1.0 - ratio if self.style == "linear" else 0.5 * (math.cos(math.pi * ratio) + 1.0)
        return self.min_lr + coeff * (self.max_lr - self.min_lr)


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


class LossScaler:
    """fp16 loss scaling: Megatron's DynamicGradScaler, or its ConstantGradScaler when ``loss_scale`` is
    given; a constant 1 without fp16.

    The loss is multiplied by ``scale`` before backward; the caller divides the gradients by it and
    reports whether their global norm was finite. An overflow skips the step (also with a static scale)
    and, when dynamic, after ``hysteresis`` overflows halves the scale (never below ``min_scale``);
    ``window`` clean steps double it.
    """

    def __init__(self, config: PrecisionConfig) -> None:
        self.enabled = config.fp16 and config.loss_scale is None
        if config.fp16:
            self.scale = config.loss_scale if config.loss_scale is not None else config.initial_loss_scale
        else:
            self.scale = 1.0
        self.min_scale = config.min_loss_scale
        self.window = config.loss_scale_window
        self.hysteresis = config.hysteresis
        self.hysteresis_left = config.hysteresis
        self.clean_steps = 0

    def update(self, found_inf: bool) -> None:
        """Advance the scale after a step whose gradients did (not) overflow."""
        if not self.enabled:
            return
        if found_inf:
            self.clean_steps = 0
            self.hysteresis_left -= 1
            if self.hysteresis_left <= 0:
                self.scale = max(self.scale * LOSS_SCALE_BACKOFF_FACTOR, self.min_scale)
            return
        self.clean_steps += 1
        if self.clean_steps == self.window:
            self.clean_steps = 0
            self.hysteresis_left = self.hysteresis
            self.scale *= LOSS_SCALE_GROWTH_FACTOR

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Plain tensors only, so checkpoints load without unpickling."""
        return {"scale": torch.tensor(self.scale, dtype=torch.float64),
                "clean_steps": torch.tensor(self.clean_steps), "hysteresis_left": torch.tensor(self.hysteresis_left)}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.scale = float(state["scale"])
        self.clean_steps = int(state["clean_steps"])
        self.hysteresis_left = int(state["hysteresis_left"])
