"""Expert parallelism: each MoE layer's experts sharded over the ``ep`` mesh dimension (``Shard(0)`` DTensors,
so checkpoints, initialisation and the gradient norm treat them as any sharded parameter), and the reduction
of their gradients over the rest of data parallelism.

Layout (Megatron's): ``ep`` divides the data-parallel size; the data-parallel ranks are
``expert_dp x ep`` (ep fastest), and ep rank r holds experts r E/ep ... (r+1) E/ep - 1 of every MoE layer.
A token batch stays on its data-parallel rank except inside a MoE layer, where its rows travel to the
experts' ranks and back (`trainer.moe.dispatch`). Under context parallelism the same holds with the dp x cp
ranks in place of the data-parallel ones (Megatron folds cp into the expert layout:
`trainer.parallel.dims.ParallelDims.expert_mesh`): each cp rank sends its share of the sequence's tokens, and
"the data-parallel size" below is dp x cp (the replicas every other gradient is averaged over).

Under tensor parallelism the router and experts are replicated over ``tp`` (Megatron's layout with an
expert-tensor-parallel size of 1): every tp rank routes and computes all of its data-parallel rank's tokens,
so its expert gradients equal its tp peers' (plain tensors, like the norms: counted once in the gradient norm).

Under ZeRO stages 0-1 `reduce_expert_grads` averages the expert gradients after backward. Under stages 2-3
(FSDP2, torchtitan's layout) `apply_expert_fsdp` shards each MoE layer's experts over ``expert_dp`` in an
FSDP2 unit of their own, before the blocks and the root are sharded over ``dp`` (which then leave the expert
weights to that unit): an expert weight becomes a DTensor on the 2-D (expert_dp, ep) mesh, and its unit's
reduce-scatter over expert_dp, divided by the whole data-parallel size, gives the same mean as stages 0-1.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import PrepareModuleInputOutput
from torch.nn.parallel import DistributedDataParallel

from trainer.moe.experts import StackedWeight
from trainer.moe.layer import MoELayer

# The mesh dimension expert weights are sharded over (`apply_ep`); FSDP2 adds ``expert_dp`` in front of it.
EP_DIM = "ep"


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
    """Whether ``param`` is an expert weight sharded by `apply_ep` (over ``ep`` alone, or over (expert_dp, ep)
    once `apply_expert_fsdp` sharded it)."""
    return isinstance(param, DTensor) and EP_DIM in (param.device_mesh.mesh_dim_names or ())


def expert_units(model: nn.Module) -> list[nn.Module]:
    """The expert containers (`GroupedExperts`) of ``model``'s expert-parallel MoE layers: the modules whose
    forward reads the sharded expert weights, so FSDP2's hooks around it gather them (a `StackedWeight` has no
    forward of its own)."""
    return [module.experts for module in model.modules()
            if isinstance(module, MoELayer) and module.ep_group is not None]


def expert_shard_placement(expert_dp: int) -> Callable[[nn.Parameter], Shard]:
    """FSDP2's ``shard_placement_fn`` for expert weights over ``expert_dp`` ranks: the first dimension of the
    rank's local [E_local, in, out] that divides evenly (dim 0, the experts, when E_local allows; torchtitan
    shards dim 1 when there are fewer local experts than expert_dp ranks), else dim 0 padded (FSDP2 shards
    another dimension only evenly)."""
    def placement(param: nn.Parameter) -> Shard:
        local_shape = param.to_local().shape if isinstance(param, DTensor) else param.shape
        even = [dim for dim, size in enumerate(local_shape) if size % expert_dp == 0]
        return Shard(even[0] if even else 0)
    return placement


def apply_expert_fsdp(model: nn.Module, expert_dp_mesh: DeviceMesh, dp: int, options: dict[str, object]) -> None:
    """ZeRO stages 2-3 for the experts sharded by `apply_ep`: one FSDP2 unit per MoE layer's experts over
    ``expert_dp_mesh``. Call it before `trainer.parallel.parallelize.apply_fsdp` shards the blocks over ``dp`` (FSDP2
    leaves parameters a child unit manages to that unit).

    After backward a rank's expert gradient sums the tokens of its whole ep group (the all-to-all's backward
    brought them); the unit's reduce-scatter sums it over the expert_dp replicas and divides by ``dp`` (not by
    expert_dp, FSDP2's default): the mean over every data-parallel rank, what `reduce_expert_grads` gives at
    stages 0-1 and DDP/FSDP2 give every other weight.

    Args:
        model: a model (or pipeline part) after `apply_ep`, on the meta device or allocated.
        expert_dp_mesh: the ``expert_dp`` dimension of the run's mesh.
        dp: the whole data-parallel size (expert_dp x ep).
        options: ``fully_shard``'s arguments for the run's stage, as the rest of the model
            (`trainer.parallel.parallelize.fsdp_options`).
    """
    placement = expert_shard_placement(expert_dp_mesh.size())
    for experts in expert_units(model):
        fully_shard(experts, mesh=expert_dp_mesh, shard_placement_fn=placement, **options)
        experts.set_gradient_divide_factor(float(dp))
        if expert_dp_mesh.size() > 1:
            # A divide factor other than the group's size makes a PREMUL_SUM reduce-scatter, which gloo lacks:
            # a plain sum, then one division of the shard, works on every backend. Over one rank there is no
            # reduce-scatter: FSDP2 divides its copy of the gradient by the factor, and forcing the sum would
            # divide it a second time (torch 2.13).
            experts.set_force_sum_reduction_for_comms(True)


@torch.no_grad()
def reduce_expert_grads(params: list[nn.Parameter], expert_dp_group: dist.ProcessGroup | None, dp: int) -> None:
    """Average the expert gradients as data parallelism averages the others (ZeRO stages 0-1; under FSDP2
    `apply_expert_fsdp`'s units do it).

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
