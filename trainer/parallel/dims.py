"""The (pp, dp, cp, tp) layout of a run: degrees, every divisibility rule, and the one device mesh.

All rules are checked here, from the config alone, before the first collective: a layout that
cannot work fails on every rank with the same one-line `TrainConfigError` instead of a gloo abort
or a hang (for example sequence parallelism with a sequence length not divisible by tp kills the
process inside gloo).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from trainer.config import ParallelismConfig, TrainConfig
from trainer.errors import TrainConfigError
from trainer.parallel.plan import FamilyLayout

MESH_DIM_NAMES = ("pp", "dp", "tp")
# With context parallelism cp sits between dp and tp (Megatron's order tp-cp-dp-pp); the replicated parameters'
# gradients are reduced over the flattened (dp, cp), as Megatron's data-parallel-with-cp group.
CP_MESH_DIM_NAMES = ("pp", "dp", "cp", "tp")
DP_CP_DIM = "dp_cp"
# With expert parallelism dp is the flattened (expert_dp, ep): Megatron's order, ep fastest within dp. With context
# parallelism too, the expert layout is a mesh of its own over the same ranks: (expert_dp, ep) re-splits the
# flattened (dp, cp), as Megatron folds cp into the expert-data-parallel ranks.
EP_MESH_DIM_NAMES = ("pp", "expert_dp", "ep", "tp")


def pad_vocab_size(vocab_size: int, divisible_by: int, tp: int) -> int:
    """Megatron's padding: round up to a multiple of ``divisible_by * tp`` so every tp shard is equal."""
    multiple = divisible_by * tp
    return -(-vocab_size // multiple) * multiple


@dataclass(frozen=True, slots=True)
class ParallelDims:
    """Degrees of pipeline, data and tensor parallelism and the batch split they imply."""

    pp: int
    dp: int
    tp: int
    micro_batch_size: int
    num_microbatches: int
    """Micro-batches per optimiser step on one dp rank (gradient accumulation, or pipeline micro-batches)."""
    ep: int = 1
    """Expert-parallel degree: a divisor of dp x cp (each MoE layer's experts sharded over ep of those ranks)."""
    cp: int = 1
    """Context-parallel degree: each sample's sequence split over cp ranks (`trainer.parallel.context`); the cp
    ranks of a data-parallel rank read the same samples."""

    @property
    def world_size(self) -> int:
        return self.pp * self.dp * self.cp * self.tp

    @property
    def replica_dim(self) -> str:
        """The mesh dim over which the replicated parameters' gradients are averaged: dp, or (dp, cp)."""
        return DP_CP_DIM if self.cp > 1 else "dp"

    @property
    def replicas(self) -> int:
        """Ranks of ``replica_dim``: dp x cp."""
        return self.dp * self.cp

    @property
    def global_batch_size(self) -> int:
        return self.micro_batch_size * self.dp * self.num_microbatches

    def build_mesh(self, device_type: str) -> DeviceMesh:
        """One mesh over all ranks with named dims ``pp``, ``dp``, ``tp`` (tp fastest, as Megatron); under
        expert parallelism ``pp``, ``expert_dp``, ``ep``, ``tp``, with ``dp`` their flattened (expert_dp, ep); under
        context parallelism ``pp``, ``dp``, ``cp``, ``tp`` with ``dp_cp`` the flattened (dp, cp)."""
        if self.cp > 1:
            mesh = init_device_mesh(device_type, (self.pp, self.dp, self.cp, self.tp), mesh_dim_names=CP_MESH_DIM_NAMES)
            mesh["dp", "cp"]._flatten(DP_CP_DIM)
            return mesh
        if self.ep == 1:
            return init_device_mesh(device_type, (self.pp, self.dp, self.tp), mesh_dim_names=MESH_DIM_NAMES)
        mesh = init_device_mesh(device_type, (self.pp, self.dp // self.ep, self.ep, self.tp),
                                mesh_dim_names=EP_MESH_DIM_NAMES)
        mesh["expert_dp", "ep"]._flatten("dp")
        return mesh

    def expert_mesh(self, mesh: DeviceMesh) -> DeviceMesh:
        """The mesh with the expert layout's dims ``ep`` and ``expert_dp`` (under expert parallelism).

        ``mesh`` itself without context parallelism (`build_mesh`). With it, Megatron's folding: the same ranks
        as ``mesh`` (pp, dp, cp, tp) with the flattened (dp, cp) re-split as (expert_dp, ep), ep fastest, so an
        expert-parallel group is drawn from the dp x cp ranks and expert_dp = dp x cp / ep. Collective: every
        rank builds it (one process group per new group of ranks)."""
        if self.cp == 1:
            return mesh
        ranks = mesh.mesh.reshape(self.pp, self.replicas // self.ep, self.ep, self.tp)
        return DeviceMesh(mesh.device_type, ranks, mesh_dim_names=EP_MESH_DIM_NAMES)


def resolve_parallel_dims(config: TrainConfig, world_size: int,
                          layout_rules: Callable[[TrainConfig, int], FamilyLayout]) -> ParallelDims:
    """Check every layout rule of ``config`` on ``world_size`` processes and return the layout.

    Args:
        config: the run's configuration.
        world_size: number of processes.
        layout_rules: the model family's own rules (its `ModelSpec.layout_rules`, handed down by the caller).

    Raises:
        TrainConfigError: naming the fields and numbers of the first rule that fails.
    """
    par, model, training = config.parallelism, config.model, config.training
    tp, pp, cp = par.tensor_model_parallel_size, par.pipeline_model_parallel_size, par.context_parallel_size
    if world_size % (tp * pp * cp):
        raise TrainConfigError(f"world size {world_size} (num_gpus_per_node x num_nodes) is not divisible by "
                               f"tensor_model_parallel_size ({tp}) x pipeline_model_parallel_size ({pp})"
                               + (f" x context_parallel_size ({cp})" if cp > 1 else ""))
    dp = world_size // (tp * pp * cp)
    rules = [
        (model.num_attention_heads % tp == 0,
         f"num_attention_heads ({model.num_attention_heads}) is not divisible by tensor_model_parallel_size ({tp})"),
        (model.ffn_hidden_size % tp == 0,
         f"ffn_hidden_size ({model.ffn_hidden_size}) is not divisible by tensor_model_parallel_size ({tp})"),
    ]
    family = layout_rules(config, tp)
    rules += family.rules
    ep = config.moe.expert_model_parallel_size
    rules += _expert_rules(config, dp, cp, ep)
    rules += _context_rules(config, cp)
    num_layers, layers_name = family.num_layers, family.layers_name
    if par.pipeline_schedule == "interleaved":
        per_chunk = par.num_layers_per_virtual_pipeline_stage
        rules.append((pp > 1, "pipeline_schedule interleaved needs pipeline_model_parallel_size > 1"))
        rules.append((per_chunk is not None,
                      "pipeline_schedule interleaved needs num_layers_per_virtual_pipeline_stage"))
        if per_chunk is not None:
            rules.append((num_layers % (per_chunk * pp) == 0,
                          f"{layers_name} is not divisible by num_layers_per_virtual_pipeline_stage "
                          f"({per_chunk}) x pipeline_model_parallel_size ({pp})"))
    rules.append((num_layers % pp == 0,
                  f"{layers_name} is not divisible by pipeline_model_parallel_size ({pp})"))
    for ok, message in rules:
        if not ok:
            raise TrainConfigError(message)
    num_microbatches = _resolve_accumulation(training.micro_batch_size, dp, training.global_batch_size,
                                             training.num_accumulation_steps)
    # Every pipeline schedule needs whole rounds of pp micro-batches (Interleaved1F1B and 1F1B require
    # at least pp; Megatron requires a multiple for the interleaved schedule).
    if num_microbatches % pp:
        raise TrainConfigError(
            f"the number of micro-batches per step ({num_microbatches} = global_batch_size / (micro_batch_size x "
            f"data-parallel size {dp})) is not divisible by pipeline_model_parallel_size ({pp})")
    return ParallelDims(pp=pp, dp=dp, tp=tp, micro_batch_size=training.micro_batch_size,
                        num_microbatches=num_microbatches, ep=ep, cp=cp)


def _context_rules(config: TrainConfig, cp: int) -> list[tuple[bool, str]]:
    """The layouts context parallelism does not combine with yet (the family adds its own sequence rules)."""
    if cp == 1:
        return []
    moe = config.moe
    return [
        # Capacity drops the assignments past an expert's capacity in token order: per rank, a cp rank's share
        # would drop other tokens than one process does.
        (moe.num_experts is None or (moe.moe_expert_capacity_factor is None and moe.moe_expert_capacity is None),
         f"context_parallel_size ({cp}) > 1 does not combine with moe_expert_capacity_factor or moe_expert_capacity "
         "yet (tokens would be dropped per rank's share of the sequence): use dropless routing"),
        (not config.parallelism.keyed_dropout,
         f"keyed_dropout does not combine with context_parallel_size ({cp}) > 1: its masks index whole sequences"),
    ]


def overlap_notes(par: ParallelismConfig, dp: int) -> list[str]:
    """Megatron's overlap switches where this layout does not overlap (`trainer.parallel.zero`): gradients are
    averaged after the backward pass under tensor/pipeline parallelism at ZeRO 0-1, and ZeRO 1 all-gathers
    the parameters after the optimiser step. The result is the same either way (the switches only move
    communication in time), so a Megatron script keeps running: one warning line each, naming what happens
    instead. ``dp``: the ranks the replicated parameters' gradients are averaged over (dp x cp); one has
    nothing to reduce or gather."""
    if dp == 1:
        return []
    tp, pp, stage = par.tensor_model_parallel_size, par.pipeline_model_parallel_size, par.zero_stage
    notes = []
    if par.overlap_grad_reduce and stage < 2 and (tp > 1 or pp > 1):
        notes.append(f"--overlap-grad-reduce: with tensor_model_parallel_size {tp} and pipeline_model_parallel_size "
                     f"{pp} at zero_stage {stage} the data-parallel gradients are averaged after the backward pass, "
                     "not during it (same result); zero_stage 2 or 3 reduce-scatters them during backward")
    if par.overlap_param_gather and stage == 1:
        notes.append("--overlap-param-gather: zero_stage 1 (use_distributed_optimizer) all-gathers the parameters "
                     "after the optimiser step, not during the forward pass (same result); zero_stage 2 or 3 "
                     "prefetch them")
    return notes


def _expert_rules(config: TrainConfig, dp: int, cp: int, ep: int) -> list[tuple[bool, str]]:
    """Mixture-of-experts layout rules: ep divides the experts and the data-parallel x context-parallel size
    (Megatron's expert layout draws the ep groups from those ranks). Any tp works: the experts are replicated
    over it; so does every ZeRO stage: FSDP2 shards the experts over expert_dp (`trainer.moe.parallel`)."""
    moe = config.moe
    if moe.num_experts is None:
        return []
    ranks = f"the data-parallel size ({dp})" + (f" x context_parallel_size ({cp})" if cp > 1 else "")
    return [
        (moe.num_experts % ep == 0,
         f"num_experts ({moe.num_experts}) is not divisible by expert_model_parallel_size ({ep})"),
        ((dp * cp) % ep == 0, f"{ranks} is not divisible by expert_model_parallel_size ({ep})"),
    ]


def _resolve_accumulation(micro: int, dp: int, global_batch: int | None, accumulation: int | None) -> int:
    """global = micro x dp x accumulation; either may be given, both must agree."""
    if global_batch is None:
        return accumulation or 1
    if global_batch % (micro * dp):
        raise TrainConfigError(f"global_batch_size ({global_batch}) is not divisible by micro_batch_size ({micro}) "
                               f"x data-parallel size ({dp})")
    derived = global_batch // (micro * dp)
    if accumulation is not None and accumulation != derived:
        raise TrainConfigError(f"num_accumulation_steps ({accumulation}) disagrees with global_batch_size "
                               f"({global_batch}) / (micro_batch_size ({micro}) x data-parallel size ({dp})) = {derived}")
    return derived
