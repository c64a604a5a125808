"""Expert parallelism: each MoE layer's experts sharded over the ``ep`` mesh dimension (``Shard(0)`` DTensors,
so checkpoints, initialisation and the gradient norm treat them as any sharded parameter), and the reduction
of their gradients over the rest of data parallelism.

Layout (Megatron's): ``ep`` divides the data-parallel size; the data-parallel ranks are
``expert_dp x ep`` (ep fastest), and ep rank r holds experts r E/ep ... (r+1) E/ep - 1 of every MoE layer.
A token batch stays on its data-parallel rank except inside a MoE layer, where its rows travel to the
experts' ranks and back (`trainer.moe.dispatch`).

Under tensor parallelism the router and experts are replicated over ``tp`` (Megatron's layout with an
expert-tensor-parallel size of 1): every tp rank routes and computes all of its data-parallel rank's tokens,
so its expert gradients equal its tp peers' (plain tensors, like the norms: counted once in the gradient norm).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import PrepareModuleInputOutput
from torch.nn.parallel import DistributedDataParallel

from trainer.moe.experts import StackedWeight
from trainer.moe.layer import MoELayer


def apply_ep(model: nn.Module, ep_mesh: DeviceMesh) -> None:
    """Shard the experts of every `MoELayer` of ``model`` over ``ep_mesh`` (in place, any device incl. meta)."""
    for module in model.modules():
        if isinstance(module, MoELayer):
            module.ep_group = ep_mesh.get_group()
        elif isinstance(module, StackedWeight):
            module.weight = nn.Parameter(distribute_tensor(module.weight.data, ep_mesh, [Shard(0)],
                                                           src_data_rank=None))


def replicated_moe_plan(sequence_parallel: bool, name: str = "feed_forward") -> dict[str, object]:
    """The tensor-parallel plan entries of a block whose ``name`` module is a `MoELayer`: none without sequence
    parallelism (its input, the replicated residual stream, and its output are plain tensors, its parameters
    stay whole on every tp rank). With it, the layer sees the whole sequence as a plain tensor (all-gathered
    from the ``Shard(1)`` residual) and hands back this rank's sequence shard: routing, capacity and the
    auxiliary losses then see the same tokens as in one process."""
    if not sequence_parallel:
        return {}
    return {name: PrepareModuleInputOutput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),),
                                           use_local_input=True, output_layouts=(Replicate(),),
                                           desired_output_layouts=(Shard(1),))}


def is_expert_parameter(param: torch.Tensor) -> bool:
    """Whether ``param`` is an expert weight sharded by `apply_ep`."""
    return isinstance(param, DTensor) and param.device_mesh.mesh_dim_names == ("ep",)


def reduce_expert_grads(params: list[nn.Parameter], expert_dp_group: dist.ProcessGroup | None, dp: int) -> None:
    """Average the expert gradients as data parallelism averages the others.

    After the backward pass, an ep rank's expert gradient holds the contributions of every token its experts
    computed, from all ranks of its ep group (the all-to-all's backward brought them). Summing over the
    ``expert_dp`` ranks (the replicas of the same experts) covers the whole global batch; dividing by ``dp``
    makes it the mean over data-parallel ranks, as DDP's average makes the other gradients.
    """
    for param in params:
        if param.grad is None or not is_expert_parameter(param):
            continue
        local = param.grad.to_local()
        if expert_dp_group is not None and dist.get_world_size(expert_dp_group) > 1:
            dist.all_reduce(local, group=expert_dp_group)
        local.div_(dp)


def ignore_expert_parameters(model: nn.Module) -> None:
    """Keep DDP away from ``model``'s sharded expert weights (DDP neither reduces DTensors nor should average
    gradients of different experts); call before wrapping."""
    names = [name for name, param in model.named_parameters() if is_expert_parameter(param)]
    DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(model, names)
