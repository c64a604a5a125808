"""AdamW with Megatron's parameter groups, the schedule's rates applied to them, and fp16 dynamic loss scaling."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from trainer.config import OptimizerConfig, PrecisionConfig
from trainer.errors import CheckpointError
from trainer.optim.lr_schedule import NUMERIC_STATE_KEYS, STYLE_STATE_KEYS, ParamScheduler

# Megatron's DynamicGradScaler constants: double after a clean window, halve after hysteresis overflows.
LOSS_SCALE_GROWTH_FACTOR = 2.0
LOSS_SCALE_BACKOFF_FACTOR = 0.5
# Checkpoint names of the learning-rate schedule's state: ``opt_param_scheduler.<Megatron's key>``.
SCHEDULER_PREFIX = "opt_param_scheduler."
# Device types whose fused AdamW kernel the runs use (torch has one for others too, e.g. MPS, not tried here).
FUSED_ADAMW_DEVICES = frozenset({"cuda", "cpu"})


# AdamW's update kernels, fastest first: one fused kernel over all parameters (CUDA; on a CPU vectorised over each
# tensor), multi-tensor (``_foreach_*``) kernels, one loop iteration per parameter. -> `torch.optim.AdamW` keyword
# arguments.
ADAMW_KERNEL_OPTIONS: dict[str, dict[str, bool]] = {
    "fused": {"fused": True},
    "foreach": {"foreach": True},
    "for-loop": {"foreach": False},
}


def select_adamw_kernel(device_type: str, params: Iterable[torch.Tensor]) -> str:
    """The fastest AdamW kernel (a key of `ADAMW_KERNEL_OPTIONS`) that ``params`` allow on ``device_type``.

    "fused" on CUDA and on CPUs, "foreach" on other devices, when the parameters are all plain tensors or all
    DTensors on one device mesh; "for-loop" when they mix plain tensors and DTensors (tensor
    parallelism leaves norm weights plain) or DTensors on different meshes (tensor parallelism under
    FSDP2): the multi-tensor and fused kernels take one list per call and reject such lists. On a CPU the fused
    kernel steps GPT-2 small's parameters about 5x faster than the multi-tensor one (`benchmarks/optimizer_step.py`).
    """
    meshes = {p.device_mesh if isinstance(p, DTensor) else None for p in params}
    if len(meshes) > 1:
        return "for-loop"
    return "fused" if device_type in FUSED_ADAMW_DEVICES else "foreach"


def build_optimizer(named_params: list[tuple[str, nn.Parameter]], config: OptimizerConfig,
                    foreach: bool | None = None, fused: bool | None = None,
                    decayed: frozenset[str] | None = None, decoupled: frozenset[str] = frozenset()
                    ) -> torch.optim.AdamW:
    """AdamW over ``named_params``; biases and norm weights (every 1-D parameter) get no weight decay.

    Args:
        named_params: the parameters this rank optimises, with their full-model names.
        config: optimiser settings.
        foreach: use the multi-tensor kernels (None: PyTorch's default, the for-loop on a CPU).
        fused: use the fused kernel (CUDA). `select_adamw_kernel` says which of the two the parameters
            allow (``**ADAMW_KERNEL_OPTIONS[kernel]``).
        decayed: the names that get weight decay, when the tensors stepped are not the model's own
            (`trainer.parallel.zero.ShardedAdamW` steps 1-D slices); default: the parameters of 2 or more dims.
        decoupled: the names of the embedding and output layer, which get ``config.decoupled_lr`` (when given).
    """
    named_params = list(named_params)  # callers may pass a generator: it is read twice
    if decayed is None:
        decayed = frozenset(name for name, p in named_params if p.ndim >= 2)
    # Megatron's groups: ``wd_mult`` scales the scheduled weight decay; with --decoupled-lr the embedding and
    # output layer get their own peak (and minimum) learning rate.
    own_rates = {} if config.decoupled_lr is None else {"max_lr": config.decoupled_lr} | (
        {} if config.decoupled_min_lr is None else {"min_lr": config.decoupled_min_lr})
    own = decoupled if own_rates else frozenset()
    groups = []
    for rates, members in (({}, lambda name: name not in own), (own_rates, lambda name: name in own)):
        for wd_mult in (1.0, 0.0):
            params = [p for name, p in named_params if members(name) and (name in decayed) == bool(wd_mult)]
            if params or not rates:  # the two plain groups always exist
                groups.append({"params": params, "weight_decay": config.weight_decay * wd_mult,
                               "wd_mult": wd_mult} | rates)
    return torch.optim.AdamW(groups, lr=config.lr, betas=(config.adam_beta1, config.adam_beta2),
                             eps=config.adam_eps, foreach=foreach, fused=fused)


def embedding_and_output_names(named_params: Iterable[tuple[str, nn.Parameter]],
                               vocab_rows: Iterable[str]) -> frozenset[str]:
    """The names of Megatron's "embedding or output" parameters (--decoupled-lr): those whose rows are the
    vocabulary (the model spec's ``vocab_rows``), under whatever prefix the run's layout puts on them."""
    rows = tuple(vocab_rows)
    return frozenset(name for name, _ in named_params if any(name == row or name.endswith("." + row) for row in rows))


def init_optimizer_state(optimizer: torch.optim.AdamW) -> None:
    """Create AdamW's per-parameter state (zero moments, step 0) before the first step, as
    ``AdamW.step`` would, so a checkpoint can be loaded into it in place. As torch's AdamW does, the step
    count is a float32 tensor on the parameter's device for the fused and capturable kernels (which read it
    there: a CUDA run's fused kernel refuses a CPU one), and a CPU tensor otherwise."""
    for group in optimizer.param_groups:
        on_device = group["fused"] or group["capturable"]
        for p in group["params"]:
            if not optimizer.state[p]:
                step = torch.zeros((), dtype=torch.float32, device=p.device) if on_device else torch.tensor(0.0)
                optimizer.state[p] = {"step": step,
                                      "exp_avg": torch.zeros_like(p, memory_format=torch.preserve_format),
                                      "exp_avg_sq": torch.zeros_like(p, memory_format=torch.preserve_format)}


def apply_schedule(optimizer: torch.optim.Optimizer, scheduler: ParamScheduler) -> None:
    """Set every parameter group's learning rate and weight decay to the schedule's for the next step, as
    Megatron's scheduler does: a group's own ``max_lr``/``min_lr`` (--decoupled-lr) and its ``wd_mult``."""
    wd = scheduler.wd()
    for group in optimizer.param_groups:
        group["lr"] = scheduler.lr(group.get("max_lr"), group.get("min_lr"))
        group["weight_decay"] = wd * group["wd_mult"]


def scheduler_state_tensors(scheduler: ParamScheduler) -> dict[str, torch.Tensor]:
    """The schedule's state (Megatron's keys) as checkpoint tensors: numbers as float64 (exact for sample
    counts below 2**53), the styles as their index in the choices."""
    state = {}
    for key, value in scheduler.state_dict().items():
        if key in STYLE_STATE_KEYS:
            state[SCHEDULER_PREFIX + key] = torch.tensor(STYLE_STATE_KEYS[key].index(value), dtype=torch.int64)
        else:
            state[SCHEDULER_PREFIX + key] = torch.tensor(float(value), dtype=torch.float64)
    return state


def scheduler_state_from_tensors(state: dict[str, torch.Tensor]) -> dict[str, float | str]:
    """`ParamScheduler.load_state_dict`'s input from a checkpoint's tensors (`scheduler_state_tensors`).

    Raises:
        CheckpointError: a style index is not one of the choices.
    """
    loaded: dict[str, float | str] = {key: float(state[SCHEDULER_PREFIX + key]) for key in NUMERIC_STATE_KEYS}
    for key, choices in STYLE_STATE_KEYS.items():
        index = int(state[SCHEDULER_PREFIX + key])
        if not 0 <= index < len(choices):
            raise CheckpointError(f"checkpoint tensor {SCHEDULER_PREFIX + key} is {index}: not a style index "
                                  f"(0-{len(choices) - 1})")
        loaded[key] = choices[index]
    return loaded


class LossScaler:
    """fp16 loss scaling: Megatron's DynamicGradScaler, or its ConstantGradScaler when ``loss_scale`` is
    given (with fp16 or, as in Megatron, bf16); a constant 1 otherwise.

    The loss is multiplied by ``scale`` before backward; the caller divides the gradients by it and
    reports whether their global norm was finite. An overflow skips the step (also with a static scale)
    and, when dynamic, after ``hysteresis`` overflows halves the scale (never below ``min_scale``);
    ``window`` clean steps double it.
    """

    def __init__(self, config: PrecisionConfig) -> None:
        self.enabled = config.fp16 and config.loss_scale is None
        if config.loss_scale is not None:  # fp16 or bf16 (`PrecisionConfig`): Megatron's ConstantGradScaler
            self.scale = config.loss_scale
        elif config.fp16:
            self.scale = config.initial_loss_scale
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
