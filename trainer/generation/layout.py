"""`GenerationLayout`: the tensor-, pipeline-, data- and expert-parallel degrees of a generation run, checked,
its device mesh (the trainer's: ``(pp, dp, tp)``, or ``(pp, expert_dp, ep, tp)`` with ``dp`` their flattening
under expert parallelism), and what expert parallelism asks of the replicas. What must divide by tp and pp
is the family's to say (`trainer.models.gpt.sharded.sharded_layout`).

Expert parallelism, as in training (Megatron's layout): the ``ep`` ranks of a group are ``ep`` data-parallel
replicas, each with its own prompts, and each MoE layer's experts are sharded over them
(`trainer.moe.parallel.apply_ep`): a MoE layer sends every rank's tokens to the ranks holding their experts
with an ``all_to_all`` over the group. That exchange is collective, so the ranks of a group must run the same
forward passes: each replica runs the same number of batches (`trainer.generation.replicas.map_over_replicas`
with ``lockstep`` adds filler prompts, whose results are dropped) and a batch decodes until its rows are done
on every rank of the group (`finished_everywhere`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup
from torch.distributed.device_mesh import DeviceMesh

from trainer.errors import TrainConfigError
from trainer.parallel.dims import ParallelDims


@dataclass(frozen=True, slots=True)
class GenerationLayout:
    """Tensor-, pipeline-, (derived) data- and expert-parallel degrees of a generation run."""

    tp: int
    pp: int
    dp: int
    ep: int = 1
    """Ranks each MoE layer's experts are sharded over: a divisor of dp (1: every rank holds every expert)."""

    @classmethod
    def resolve(cls, tp: int, pp: int, world_size: int, split_by_tp: dict[str, int],
                split_by_pp: dict[str, int], ep: int = 1, num_experts: int | None = None) -> GenerationLayout:
        """Check that the model splits over tp x pp (and its experts over ep), and that the world is a
        multiple of tp x pp x ep.

        Args:
            split_by_tp: the model's sizes that tensor parallelism divides, by name (heads, vocabulary, ...).
            split_by_pp: those that pipeline stages divide (layers).
            ep: the expert-parallel degree.
            num_experts: experts per MoE layer; None for a dense model (which refuses ep > 1).

        Raises:
            TrainConfigError: naming the sizes that do not divide.
        """
        tp_name, pp_name = f"tensor_model_parallel_size ({tp})", f"pipeline_model_parallel_size ({pp})"
        ep_name = f"expert_model_parallel_size ({ep})"
        if world_size % (tp * pp):
            raise TrainConfigError(f"world size {world_size} is not divisible by {tp_name} x {pp_name}")
        for sizes, degree, degree_name in ((split_by_tp, tp, tp_name), (split_by_pp, pp, pp_name)):
            for name, value in sizes.items():
                if value % degree:
                    raise TrainConfigError(f"{name} ({value}) is not divisible by {degree_name}")
        dp = world_size // (tp * pp)
        if ep > 1:
            if num_experts is None:
                raise TrainConfigError(f"{ep_name} needs a model with experts; this one is dense")
            if num_experts % ep:
                raise TrainConfigError(f"num_experts ({num_experts}) is not divisible by {ep_name}")
            if dp % ep:
                raise TrainConfigError(f"the data-parallel size ({dp} = world size {world_size} / ({tp_name} x "
                                       f"{pp_name})) is not divisible by {ep_name}")
        return cls(tp=tp, pp=pp, dp=dp, ep=ep)

    def build_mesh(self, device_type: str) -> DeviceMesh | None:
        """The trainer's mesh (`trainer.parallel.dims.ParallelDims.build_mesh`), or None in a single process."""
        if self.tp * self.pp * self.dp == 1:
            return None
        # Generation has no micro-batches: one per replica.
        dims = ParallelDims(pp=self.pp, dp=self.dp, tp=self.tp, micro_batch_size=1, num_microbatches=1, ep=self.ep)
        return dims.build_mesh(device_type)


def finished_everywhere(done: torch.Tensor, ep_group: ProcessGroup | None) -> bool:
    """Whether every row of ``done`` (bool [batch]) is done, on this rank and (collective over ``ep_group``,
    when given) on every rank of its expert-parallel group: a batch stops decoding only when the whole
    group's does, since every decoding step runs the MoE layers' all_to_all."""
    if ep_group is None:
        return bool(done.all())
    finished = done.all().to(torch.int64).reshape(1)  # gloo reduces no bool tensors
    dist.all_reduce(finished, op=dist.ReduceOp.MIN, group=ep_group)
    return bool(finished.item())
