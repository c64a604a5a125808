"""The (pp, dp, tp) layout of a run: degrees, every divisibility rule, and the one device mesh.

All rules are checked here, from the config alone, before the first collective: a layout that
cannot work fails on every rank with the same one-line `TrainConfigError` instead of a gloo abort
or a hang (for example sequence parallelism with a sequence length not divisible by tp kills the
process inside gloo).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from trainer.config import TrainConfig
from trainer.errors import TrainConfigError
from trainer.models import model_spec

MESH_DIM_NAMES = ("pp", "dp", "tp")
# With expert parallelism dp is the flattened (expert_dp, ep): Megatron's order, ep fastest within dp.
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
    """Expert-parallel degree: a divisor of dp (each MoE layer's experts sharded over ep data-parallel ranks)."""

    @property
    def world_size(self) -> int:
        return self.pp * self.dp * self.tp

    @property
    def global_batch_size(self) -> int:
        return self.micro_batch_size * self.dp * self.num_microbatches

    def build_mesh(self, device_type: str) -> DeviceMesh:
        """One mesh over all ranks with named dims ``pp``, ``dp``, ``tp`` (tp fastest, as Megatron); under
        expert parallelism ``pp``, ``expert_dp``, ``ep``, ``tp``, with ``dp`` their flattened (expert_dp, ep)."""
        if self.ep == 1:
            return init_device_mesh(device_type, (self.pp, self.dp, self.tp), mesh_dim_names=MESH_DIM_NAMES)
        mesh = init_device_mesh(device_type, (self.pp, self.dp // self.ep, self.ep, self.tp),
                                mesh_dim_names=EP_MESH_DIM_NAMES)
        mesh["expert_dp", "ep"]._flatten("dp")
        return mesh


def resolve_parallel_dims(config: TrainConfig, world_size: int) -> ParallelDims:
    """Check every layout rule of ``config`` on ``world_size`` processes and return the layout.

    Args:
        config: the run's configuration.
        world_size: number of processes.

    Raises:
        TrainConfigError: naming the fields and numbers of the first rule that fails.
    """
    par, model, training = config.parallelism, config.model, config.training
    tp, pp = par.tensor_model_parallel_size, par.pipeline_model_parallel_size
    if world_size % (tp * pp):
        raise TrainConfigError(f"world size {world_size} (num_gpus_per_node x num_nodes) is not divisible by "
                               f"tensor_model_parallel_size ({tp}) x pipeline_model_parallel_size ({pp})")
    dp = world_size // (tp * pp)
    rules = [
        (model.num_attention_heads % tp == 0,
         f"num_attention_heads ({model.num_attention_heads}) is not divisible by tensor_model_parallel_size ({tp})"),
        (model.ffn_hidden_size % tp == 0,
         f"ffn_hidden_size ({model.ffn_hidden_size}) is not divisible by tensor_model_parallel_size ({tp})"),
    ]
    family = model_spec(model.model).layout_rules(config, tp)
    rules += family.rules
    ep = config.moe.expert_model_parallel_size
    rules += _expert_rules(config, dp, ep)
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
                        num_microbatches=num_microbatches, ep=ep)


def _expert_rules(config: TrainConfig, dp: int, ep: int) -> list[tuple[bool, str]]:
    """Mixture-of-experts layout rules: ep divides the experts and the data-parallel size, and the layouts
    expert parallelism does not combine with yet. Any tp works: the experts are replicated over it; so does
    every ZeRO stage: FSDP2 shards the experts over expert_dp (`trainer.moe.parallel`)."""
    moe = config.moe
    if moe.num_experts is None:
        return []
    return [
        (moe.num_experts % ep == 0,
         f"num_experts ({moe.num_experts}) is not divisible by expert_model_parallel_size ({ep})"),
        (dp % ep == 0, f"the data-parallel size ({dp}) is not divisible by expert_model_parallel_size ({ep})"),
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
