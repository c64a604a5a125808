"""Family-agnostic wrappers `trainer.parallel.runner.ParallelModel` applies to any model's parts, in torchtitan's order:
tensor parallelism (the family's plan), then activation recomputation (`trainer.parallel.recompute`), then
``torch.compile`` per block, then FSDP2 (the family's units) — or DDP when data parallelism is the only parallelism and the
distributed optimiser is off: it is the fastest pure-DP wrapper on CPU, and it does not compose with
DTensor parameters (``DDP.__init__`` fails on mixed Tensor/DTensor).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard
from torch.nn.parallel import DistributedDataParallel


def apply_compile(modules: list[nn.Module]) -> None:
    """``torch.compile`` each module's forward in place: each transformer block (torchtitan's ``apply_compile``:
    per block, after tensor parallelism and activation checkpointing, before FSDP), or a one-process run's whole
    model.

    Per block where the model is wrapped: the blocks share one code object, so dynamo compiles a block kind
    once and reuses it for its siblings, and the embeddings, head and parallel wrappers stay eager. The
    forward is replaced rather than the module wrapped (``torch.compile(module)``), so parameter names
    (checkpoints, optimiser state) gain no ``_orig_mod.`` and the hooks FSDP2 registers on the block
    later run eagerly around the compiled code, as they do around torchtitan's wrapper.
    ``fullgraph=True``: a graph break inside a module is a bug to fix, not a silent slowdown.

    A module that sets ``compile_parts_only = True`` (`COMPILE_PARTS_ONLY`; a MoE layer, whose token
    dispatch has data-dependent sizes) keeps its own forward eager, and so do the modules holding it: their
    other submodules are compiled instead (torchtitan's rule for MoE blocks: attention, norms, router
    compiled; dispatch eager).
    """
    for module in modules:
        _compile_static_parts(module)


COMPILE_PARTS_ONLY = "compile_parts_only"
"""Module attribute: True where `apply_compile` must leave the module's own forward eager."""


def _compile_static_parts(module: nn.Module) -> None:
    """Compile ``module``'s forward whole when nothing inside it asks to stay eager, else its children's
    (recursively); modules without a forward of their own (parameter holders) are left alone."""
    stays_eager = any(getattr(inner, COMPILE_PARTS_ONLY, False) for inner in module.modules())
    if not stays_eager and type(module).forward is not nn.Module.forward:
        module.forward = torch.compile(module.forward, fullgraph=True)
        return
    for child in module.children():
        _compile_static_parts(child)


def fsdp_options(reshard_after_forward: bool, cpu_offload: bool, compute_dtype: torch.dtype | None,
                 device_type: str, reduce_dtype: torch.dtype = torch.float32) -> dict[str, object]:
    """``fully_shard``'s keyword arguments for a ZeRO stage (`trainer.parallel.zero`), the same for every unit of a run.

    Args:
        reshard_after_forward: ZeRO-3 (True) or ZeRO-2 (False, FSDP2's SHARD_GRAD_OP).
        cpu_offload: FSDP2's `CPUOffloadPolicy` keeps the shards and the optimiser step on the CPU (its pinned
            host memory needs an accelerator: ``device_type`` "cuda").
        compute_dtype: autocast's dtype (None: fp32). The weights are then all-gathered already cast to it, so
            a rank holds half-precision copies of the gathered weights only (half the all-gather traffic too),
            and autocast, finding them in its dtype, caches no second copy; the sharded weights, their
            gradients after the reduce-scatter (run in float32) and the optimiser stay float32. The blocks'
            inputs are not cast: the residual stream stays float32, as under autocast alone.
        reduce_dtype: the gradients' reduce-scatter dtype with a compute_dtype (bfloat16: --grad-reduce-in-bf16).
    """
    offload = CPUOffloadPolicy(pin_memory=device_type == "cuda") if cpu_offload else OffloadPolicy()
    mixed_precision = MixedPrecisionPolicy()  # fully_shard's default: no casts
    if compute_dtype is not None:
        mixed_precision = MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=reduce_dtype,
                                               cast_forward_inputs=False)
    return dict(reshard_after_forward=reshard_after_forward, offload_policy=offload, mp_policy=mixed_precision)


def apply_fsdp(part: nn.Module, blocks: list[nn.Module], dp_mesh: DeviceMesh, options: dict[str, object]) -> None:
    """FSDP2 over ``dp_mesh``: one parameter group per transformer block (the family's
    `ParallelPlan.blocks`), everything else (embeddings, norms, heads) in the part's root group;
    ``options``: `fsdp_options`.
    """
    for block in blocks:
        fully_shard(block, mesh=dp_mesh, **options)
    fully_shard(part, mesh=dp_mesh, **options)


def apply_ddp(model: nn.Module, dp_mesh: DeviceMesh, reduce_dtype: torch.dtype = torch.float32
              ) -> DistributedDataParallel:
    """Classic DDP over ``dp_mesh`` (pure data parallelism only); ``reduce_dtype`` other than float32: each
    bucket is all-reduced in it (`_reduce_in_dtype`), else in the gradients' float32."""
    device_ids = [torch.cuda.current_device()] if dp_mesh.device_type == "cuda" else None
    ddp = DistributedDataParallel(model, process_group=dp_mesh.get_group(), device_ids=device_ids)
    if reduce_dtype != torch.float32:
        ddp.register_comm_hook((dp_mesh.get_group(), reduce_dtype), _reduce_in_dtype)
    return ddp


# `bucket` (a dist.GradBucket) and the result (a torch.futures.Future of the bucket's tensor) stay unannotated:
# DDP compares the hook's annotations with the classes themselves, and this module's are strings.
def _reduce_in_dtype(state: tuple[dist.ProcessGroup, torch.dtype], bucket):  # noqa: ANN001, ANN202
    """DDP comm hook: average a gradient bucket over the group of ``state`` in its dtype, written back into
    the bucket.

    torch's own bf16_compress_hook does the same, but DDP accepts it only with NCCL (or XCCL); this one runs on
    any backend (gloo on CPUs too)."""
    group, dtype = state
    reduced = bucket.buffer().to(dtype).div_(dist.get_world_size(group))

    def write_back(future: torch.futures.Future[list[torch.Tensor]]) -> torch.Tensor:
        buffer = bucket.buffer()
        buffer.copy_(future.value()[0])
        return buffer

    return dist.all_reduce(reduced, group=group, async_op=True).get_future().then(write_back)
