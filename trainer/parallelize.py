"""Family-agnostic wrappers `trainer.runner.ParallelModel` applies to any model's parts, in torchtitan's order:
tensor parallelism (the family's plan), then activation checkpointing, then ``torch.compile`` per block,
then FSDP2 (the family's units) — or DDP when data parallelism is the only parallelism and the
distributed optimiser is off: it is the fastest pure-DP wrapper on CPU, and it does not compose with
DTensor parameters (``DDP.__init__`` fails on mixed Tensor/DTensor).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import OffloadPolicy, fully_shard
from torch.nn.parallel import DistributedDataParallel


def apply_ac(model: nn.Module) -> None:
    """Recompute every block in the backward pass (non-reentrant checkpointing, FQNs unchanged): every
    family's model checks its ``checkpoint_activations`` attribute in its forward."""
    model.checkpoint_activations = True


def apply_compile(blocks: list[nn.Module]) -> None:
    """``torch.compile`` each block's forward in place (torchtitan's ``apply_compile``: per block, after
    tensor parallelism and activation checkpointing, before FSDP).

    Per block, not the whole model: the blocks share one code object, so dynamo compiles a block kind
    once and reuses it for its siblings, and the embeddings, head and parallel wrappers stay eager. The
    forward is replaced rather than the module wrapped (``torch.compile(module)``), so parameter names
    (checkpoints, optimiser state) gain no ``_orig_mod.`` and the hooks FSDP2 registers on the block
    later run eagerly around the compiled code, as they do around torchtitan's wrapper.
    ``fullgraph=True``: a graph break inside a block is a bug to fix, not a silent slowdown.
    """
    for block in blocks:
        block.forward = torch.compile(block.forward, fullgraph=True)


def apply_fsdp(part: nn.Module, blocks: list[nn.Module], dp_mesh: DeviceMesh, reshard_after_forward: bool,
               offload_policy: OffloadPolicy | None = None) -> None:
    """FSDP2 over ``dp_mesh``: one parameter group per transformer block (the family's
    `ParallelPlan.blocks`), everything else (embeddings, norms, heads) in the part's root group.

    ``reshard_after_forward``: ZeRO-3 (True) or ZeRO-2 (False, FSDP2's SHARD_GRAD_OP; `trainer.zero`);
    ``offload_policy``: FSDP2's `CPUOffloadPolicy` keeps the shards and the optimiser step on the CPU.
    """
    offload_policy = offload_policy or OffloadPolicy()  # fully_shard's default: no offload
    for block in blocks:
        fully_shard(block, mesh=dp_mesh, reshard_after_forward=reshard_after_forward, offload_policy=offload_policy)
    fully_shard(part, mesh=dp_mesh, reshard_after_forward=reshard_after_forward, offload_policy=offload_policy)


def apply_ddp(model: nn.Module, dp_mesh: DeviceMesh) -> DistributedDataParallel:
    """Classic DDP over ``dp_mesh`` (pure data parallelism only)."""
    device_ids = [torch.cuda.current_device()] if dp_mesh.device_type == "cuda" else None
    return DistributedDataParallel(model, process_group=dp_mesh.get_group(), device_ids=device_ids)
