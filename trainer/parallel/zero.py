"""ZeRO stages 0-3 over the data-parallel ranks, from PyTorch's own pieces.

What each stage keeps on a rank (N data-parallel ranks, Ψ parameters, fp32 weights and gradients, AdamW's
two fp32 moments; between steps the same under ``--bf16``, where autocast computes from the fp32 weights and
caches their casts from forward to the end of backward, and stages 2-3 gather the weights already cast,
`trainer.parallel.parallelize.fsdp_options`: 2Ψ, not 4Ψ, during forward/backward at stage 2):

    stage 0  replicated: DDP (or `average_gradients` under TP/PP)  4Ψ params + 4Ψ grads + 8Ψ states
    stage 1  gradients averaged as stage 0, `ShardedAdamW`        4Ψ params + 4Ψ grads + 8Ψ/N states
    stage 2  FSDP2, ``reshard_after_forward=False``               (4Ψ params during fwd/bwd) 4Ψ/N grads + 8Ψ/N
    stage 3  FSDP2, ``reshard_after_forward=True``                4Ψ/N params + 4Ψ/N grads + 8Ψ/N states

Stage 2 is FSDP2's SHARD_GRAD_OP (PyTorch's ZeRO-2): gradients are reduce-scattered block by block during
backward and the optimiser steps on shards, as DeepSpeed's stage 2; the parameters are all-gathered once
per step and stay whole through forward and backward, but FSDP2 frees them after backward, so between
steps a rank holds only its shard of them (DeepSpeed's stage 2 keeps them whole).

Under expert parallelism an expert weight is replicated on its ``expert_dp`` ranks only: stage 1 steps it
whole (`ShardedAdamW` leaves it unsliced), stages 2-3 shard it over expert_dp in an FSDP2 unit of its own
(`trainer.moe.parallel.apply_expert_fsdp`), so "N" for the experts' bytes is expert_dp.

`ShardedAdamW` (stage 1, with or without ``--cpu-offload``; also offload over one data-parallel rank): each parameter's flattened (local,
under TP) tensor is cut into N equal slices; rank r's AdamW steps slice r (a view of the parameter, or a
CPU copy when offloading), then one all-gather per dtype gives every rank the updated parameter.
Offloading from a CUDA device keeps each slice's master and gradient in pinned host buffers: the gradient
copies to the host are queued without waiting and the step waits once for all of them; the updated
masters go back the same way, ordered before the all-gather and the next forward by the device's stream.
Offloading when the parameters already live on the CPU copies nothing: the master is a view, as without
offload.
``torch.distributed.optim.ZeroRedundancyOptimizer`` was not used: it assigns whole parameters to ranks
(an embedding as large as a rank's share unbalances it), broadcasts plain tensors only (no TP DTensors)
and would need its own checkpoint consolidation.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from trainer.config import OptimizerConfig
from trainer.moe.parallel import is_expert_parameter
from trainer.optim.optimizer import ADAMW_KERNEL_OPTIONS, build_optimizer, init_optimizer_state, select_adamw_kernel

# The stage whose parameters FSDP2 reshards after forward (ZeRO-3); stage 2 keeps them until after backward.
FULL_SHARD_STAGE = 3
FSDP_STAGES = (2, 3)
# AdamW's per-parameter state keys whose tensors have the parameter's shape (``step`` is a scalar).
MOMENT_KEYS = ("exp_avg", "exp_avg_sq")
CPU = torch.device("cpu")


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's part of a (D)Tensor, sharing its storage."""
    return tensor._local_tensor if isinstance(tensor, DTensor) else tensor


def uses_fsdp(zero_stage: int, dp: int) -> bool:
    """Whether the model is wrapped in FSDP2 (stages 2 and 3 over more than one data-parallel rank)."""
    return dp > 1 and zero_stage in FSDP_STAGES


@torch.no_grad()
def average_gradients(params: Iterable[nn.Parameter], group: dist.ProcessGroup, reduce_dtype: torch.dtype | None = None
                      ) -> None:
    """Average the gradients of ``params`` over ``group`` in place, what DDP does, without a wrapper.

    Used where DDP cannot wrap the model (tensor-parallel DTensors, pipeline stages): one all-reduce per
    dtype over the flattened local gradients, after the last micro-batch's backward. Expert weights are left
    out: `trainer.moe.parallel.reduce_expert_grads` averages them over their own replicas. ``reduce_dtype``
    (bfloat16: --grad-reduce-in-bf16): the all-reduce runs in it, the result cast back; None: in their own dtype.
    """
    size = dist.get_world_size(group)
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for param in params:
        if param.grad is not None and not is_expert_parameter(param):
            grad = _local(param.grad)
            by_dtype.setdefault(grad.dtype, []).append(grad)
    for grads in by_dtype.values():
        flat = torch.cat([grad.reshape(-1) for grad in grads])
        if reduce_dtype is not None:
            flat = flat.to(reduce_dtype)
        dist.all_reduce(flat, group=group)
        flat.div_(size)
        for grad, part in zip(grads, flat.split([grad.numel() for grad in grads])):
            grad.copy_(part.view_as(grad))


class _Slice:
    """One parameter's share of `ShardedAdamW`: elements ``[start, stop)`` of its flattened local tensor
    (``size`` elements per rank, the last ranks' slices shorter or empty), and the tensor AdamW steps."""

    def __init__(self, param: nn.Parameter, rank: int, world: int, sharded: bool, offload: bool) -> None:
        self.param, self.sharded = param, sharded
        self.flat = _local(param).detach().view(-1)
        numel = self.flat.numel()
        self.size = math.ceil(numel / world) if sharded else numel
        self.start = min(rank * self.size, numel) if sharded else 0
        self.stop = min(self.start + self.size, numel)
        view = self.flat[self.start:self.stop]
        # A master on the parameter's own device (no offload, or a CPU run) is a view: AdamW's in-place update
        # is the parameter's update, and no copy is ever made.
        self.offload = offload and view.device != CPU
        self.host_grad: torch.Tensor | None = None
        master = view
        if self.offload:
            # Pinned host memory: copies to and from the device can be queued without waiting.
            pinned = view.device.type == "cuda"
            master = torch.empty(view.shape, dtype=view.dtype, pin_memory=pinned).copy_(view)
            self.host_grad = torch.empty(view.shape, dtype=view.dtype, pin_memory=pinned)
        self.master = nn.Parameter(master, requires_grad=True)

    def take_gradient(self) -> None:
        """Point the master's gradient at this slice of the (averaged) parameter gradient."""
        grad = self.param.grad
        if grad is None:
            self.master.grad = None
            return
        if isinstance(grad, DTensor) and grad.placements != self.param.placements:
            # A replicated weight's gradient can still be a pending sum over the tensor-parallel ranks
            # (AdamW on the DTensor would redistribute it the same way).
            grad = grad.redistribute(grad.device_mesh, self.param.placements)
        part = _local(grad).reshape(-1)[self.start:self.stop]
        if self.offload:
            # Queued only: `ShardedAdamW.step` waits once for every slice's copy before stepping.
            self.master.grad = self.host_grad.copy_(part, non_blocking=True)
        else:
            self.master.grad = part

    def give_back(self) -> None:
        """Queue the copy of an offloaded master's update into the parameter (ordered on the device's stream
        before anything that reads the parameter; the host master is next written after `step`'s wait)."""
        if self.offload:
            self.flat[self.start:self.stop].copy_(self.master.detach(), non_blocking=True)

    @torch.no_grad()
    def refresh_master(self) -> None:
        """Copy the parameter's slice into an offloaded master (after a checkpoint replaced the parameter)."""
        if self.offload:
            self.master.copy_(self.flat[self.start:self.stop])


class ShardedAdamW:
    """ZeRO stage 1: AdamW whose state (and, with ``offload``, master weights and step) covers only this
    rank's slice of every parameter; the parameters and their gradients stay whole on every rank.

    The gradients must already be averaged over ``group`` when `step` runs. Expert weights (sharded over
    expert parallelism already, their replicas elsewhere than ``group``) are stepped whole. Checkpoints
    see full-size state tensors (`full_state`), as stage 0 saves them, so any stage resumes from any other.
    """

    def __init__(self, named_params: list[tuple[str, nn.Parameter]], config: OptimizerConfig,
                 group: dist.ProcessGroup | None, offload: bool, device_type: str,
                 decoupled: frozenset[str] = frozenset()) -> None:
        self.group = group
        self.world = dist.get_world_size(group) if group is not None else 1
        rank = dist.get_rank(group) if group is not None else 0
        self.slices = {param: _Slice(param, rank, self.world, sharded=not is_expert_parameter(param),
                                     offload=offload) for _, param in named_params}
        masters = [(name, self.slices[param].master) for name, param in named_params]
        decayed = frozenset(name for name, param in named_params if param.ndim >= 2)
        kernel = select_adamw_kernel(CPU.type if offload else device_type, [m for _, m in masters])
        self.kernel = kernel
        self.inner = build_optimizer(masters, config, decayed=decayed, decoupled=decoupled,
                                     **ADAMW_KERNEL_OPTIONS[kernel])
        # The devices whose gradient copies to the host a step waits for (none when nothing is offloaded).
        self.copy_devices = {piece.flat.device for piece in self.slices.values() if piece.offload}

    @property
    def param_groups(self) -> list[dict]:
        return self.inner.param_groups

    def zero_grad(self, set_to_none: bool = True) -> None:
        for piece in self.slices.values():
            piece.param.grad = None
            piece.master.grad = None

    @torch.no_grad()
    def step(self) -> None:
        """Step this rank's slices, then all-gather every parameter's slices."""
        for piece in self.slices.values():
            piece.take_gradient()
        for device in self.copy_devices:  # the one wait: every queued gradient copy has landed on the host
            torch.cuda.current_stream(device).synchronize()
        self.inner.step()
        for piece in self.slices.values():
            piece.give_back()
        self._all_gather([(piece.flat, piece) for piece in self.slices.values()])

    def _all_gather(self, targets: list[tuple[torch.Tensor, _Slice]]) -> None:
        """Fill every ``flat`` of ``targets`` (a parameter, or a full-size state buffer) with all ranks'
        slices, each rank's own slice already in place: one all-gather per dtype of padded slices."""
        if self.world == 1:
            return
        by_dtype: dict[torch.dtype, list[tuple[torch.Tensor, _Slice]]] = {}
        for flat, piece in targets:
            if piece.sharded:
                by_dtype.setdefault(flat.dtype, []).append((flat, piece))
        for group in by_dtype.values():
            sizes = [piece.size for _, piece in group]
            send = torch.zeros(sum(sizes), dtype=group[0][0].dtype, device=group[0][0].device)
            for (flat, piece), part in zip(group, send.split(sizes)):
                part[:piece.stop - piece.start] = flat[piece.start:piece.stop]
            received = [torch.empty_like(send) for _ in range(self.world)]
            dist.all_gather(received, send, group=self.group)
            for rank, buffer in enumerate(received):
                for (flat, piece), part in zip(group, buffer.split(sizes)):
                    start = min(rank * piece.size, flat.numel())
                    stop = min(start + piece.size, flat.numel())
                    flat[start:stop] = part[:stop - start]

    # -- checkpoints --------------------------------------------------------------------------------------

    def init_state(self) -> None:
        """Create the zero moments of every slice (`init_optimizer_state`), so a checkpoint can load."""
        init_optimizer_state(self.inner)

    @torch.no_grad()
    def full_states(self) -> dict[nn.Parameter, dict[str, torch.Tensor]]:
        """Every parameter's AdamW state at full size (the parameter's shape and placements, on its device),
        gathered from the ranks' slices: what stage 0 would hold. Collective over the data-parallel group."""
        self.init_state()
        buffers: dict[nn.Parameter, dict[str, torch.Tensor]] = {}
        targets = []
        for param, piece in self.slices.items():
            state = self.inner.state[piece.master]
            buffers[param] = {"step": state["step"]}
            for key in MOMENT_KEYS:
                flat = torch.zeros_like(piece.flat)
                flat[piece.start:piece.stop] = state[key].to(flat.device)
                targets.append((flat, piece))
                buffers[param][key] = flat
        self._all_gather(targets)
        for param, state in buffers.items():
            for key in MOMENT_KEYS:
                local = state[key].view_as(_local(param))
                state[key] = (DTensor.from_local(local, param.device_mesh, param.placements, run_check=False)
                              if isinstance(param, DTensor) else local)
        return buffers

    @torch.no_grad()
    def load_full_states(self, states: dict[nn.Parameter, dict[str, torch.Tensor]]) -> None:
        """Keep this rank's slices of full-size states (as `full_states` gives, loaded in place)."""
        for param, state in states.items():
            piece = self.slices[param]
            own = self.inner.state[piece.master]
            own["step"].copy_(state["step"])
            for key in MOMENT_KEYS:
                own[key].copy_(_local(state[key]).reshape(-1)[piece.start:piece.stop])
        self.refresh_masters()

    def refresh_masters(self) -> None:
        """Copy the parameters into the offloaded masters (after a checkpoint was loaded into them)."""
        for piece in self.slices.values():
            piece.refresh_master()


def build_zero_optimizer(named_params: list[tuple[str, nn.Parameter]], config: OptimizerConfig, zero_stage: int,
                         offload: bool, dp_group: dist.ProcessGroup | None, device_type: str,
                         decoupled: frozenset[str] = frozenset()) -> tuple[torch.optim.AdamW | ShardedAdamW, str]:
    """The run's optimiser and the name of its AdamW kernel (`trainer.optim.optimizer.ADAMW_KERNEL_OPTIONS`).

    `ShardedAdamW` at stage 1 over several data-parallel ranks and wherever the optimiser is offloaded
    outside FSDP2; a plain AdamW otherwise (over FSDP2's sharded DTensors at stages 2-3, whose offload is
    FSDP2's own `CPUOffloadPolicy`). ``decoupled``: the embedding and output layer's names (--decoupled-lr).
    """
    dp = dist.get_world_size(dp_group) if dp_group is not None else 1
    if uses_fsdp(zero_stage, dp) or not (offload or (zero_stage >= 1 and dp > 1)):
        params = [p for _, p in named_params]
        step_device = CPU.type if offload else device_type
        kernel = select_adamw_kernel(step_device, params)
        return build_optimizer(named_params, config, decoupled=decoupled, **ADAMW_KERNEL_OPTIONS[kernel]), kernel
    optimizer = ShardedAdamW(named_params, config, dp_group if dp > 1 else None, offload, device_type, decoupled)
    return optimizer, optimizer.kernel


def optimizer_states(optimizer: torch.optim.AdamW | ShardedAdamW) -> dict[nn.Parameter, dict[str, torch.Tensor]]:
    """Each model parameter's AdamW state at its full size, as checkpoints hold it (collective for
    `ShardedAdamW`: the slices are gathered)."""
    if isinstance(optimizer, ShardedAdamW):
        return optimizer.full_states()
    return {param: state for param, state in optimizer.state.items()}


def init_state(optimizer: torch.optim.AdamW | ShardedAdamW) -> None:
    """Create the optimiser's zero state before a checkpoint is written or loaded (`init_optimizer_state`)."""
    if isinstance(optimizer, ShardedAdamW):
        optimizer.init_state()
    else:
        init_optimizer_state(optimizer)


def load_optimizer_states(optimizer: torch.optim.AdamW | ShardedAdamW,
                          states: dict[nn.Parameter, dict[str, torch.Tensor]]) -> None:
    """After a checkpoint was loaded into ``states`` (from `optimizer_states`): a `ShardedAdamW` keeps its
    slices; a plain AdamW's states were loaded in place already."""
    if isinstance(optimizer, ShardedAdamW):
        optimizer.load_full_states(states)


def refresh_masters(optimizer: torch.optim.AdamW | ShardedAdamW) -> None:
    """After model weights alone were loaded in place: an offloaded `ShardedAdamW` copies them into its host
    masters (which it steps); other optimisers step the parameters themselves."""
    if isinstance(optimizer, ShardedAdamW):
        optimizer.refresh_masters()
