"""Tensor parallelism of a GPT (or a stage of it): the GPT's `trainer.parallel.plan.ParallelPlan.apply_tp`. The
order the wrappers are applied in, and the family-agnostic ones (activation checkpointing, FSDP2 units per
block, DDP, ``torch.compile``), are `trainer.parallel.runner`'s and `trainer.parallel.parallelize`'s.
"""

from __future__ import annotations

from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from trainer.models.gpt.model import GPT, HEADS_DIM
from trainer.moe.layer import MoELayer
from trainer.moe.parallel import replicated_moe_plan


def apply_tp(model: GPT, tp_mesh: DeviceMesh, sequence_parallel: bool) -> None:
    """Shard heads, MLP and vocabulary over ``tp_mesh`` in place.

    The embeddings are vocab- (and position-) parallel (`RowwiseParallel` on an ``nn.Embedding``
    shards its rows), q/k/v (or the fused wqkv) and the first MLP linear are column-parallel, the attention and MLP
    output projections row-parallel. The output head is column-parallel over the vocabulary and
    returns a DTensor sharded on its last dim, to be consumed under ``loss_parallel``. With
    ``sequence_parallel`` the norms and the residual stream between blocks are sharded along the
    sequence (dim 1). A mixture-of-experts feed-forward stays whole on every rank
    (`trainer.moe.parallel.replicated_moe_plan`).

    Grouped-query attention: wq's rows (heads) and wk/wv's rows (groups) are split alike, so a rank holds
    heads/tp query heads and the groups/tp key/value heads they read (groups % tp == 0, checked by the layout
    rules). The q/k norms (one weight shared by every head) see their rank's heads as a DTensor sharded over the
    heads dim, so their weight gradient is summed over the tp ranks (Megatron all-reduces it by name).
    """
    residual = Shard(1) if sequence_parallel else Replicate()
    plan: dict[str, object] = {}
    if model.tok_embeddings is not None:
        for name in ("tok_embeddings", "pos_embeddings"):
            if getattr(model, name) is not None:
                plan[name] = RowwiseParallel(input_layouts=Replicate(), output_layouts=residual)
    if model.norm is not None and sequence_parallel:
        plan["norm"] = SequenceParallel()
    if model.output is not None:
        plan["output"] = ColwiseParallel(input_layouts=residual, output_layouts=Shard(-1), use_local_output=False)
    parallelize_module(model, tp_mesh, plan)
    # The fused projection's rows are per head ([heads, 3, head_dim], `trainer.models.gpt.fused_qkv`), so sharding its
    # dim 0 like wq's gives each rank the q, k and v rows of the same heads.
    qkv = ("attention.wqkv",) if model.shape.fused_qkv else ("attention.wq", "attention.wk", "attention.wv")
    for block in model.layers.values():
        block_plan: dict[str, object] = {
            **{name: ColwiseParallel() for name in qkv},
            "attention.wo": RowwiseParallel(output_layouts=residual),
        }
        if model.shape.qk_layernorm:
            block_plan |= {f"attention.{name}": SequenceParallel(sequence_dim=HEADS_DIM, use_local_output=True)
                           for name in ("q_layernorm", "k_layernorm")}
        if isinstance(block.feed_forward, MoELayer):
            block_plan |= replicated_moe_plan(sequence_parallel)
        else:
            block_plan |= {"feed_forward.w1": ColwiseParallel(),
                           "feed_forward.w2": RowwiseParallel(output_layouts=residual)}
            if model.shape.swiglu:
                block_plan["feed_forward.w3"] = ColwiseParallel()
        if sequence_parallel:
            gather = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
            block_plan |= {"attention_norm": SequenceParallel(), "ffn_norm": SequenceParallel(), "attention": gather}
            block_plan.setdefault("feed_forward", gather)
        parallelize_module(block, tp_mesh, block_plan)
    # Distributing replaced the embedding weight and the head weight by two new parameters; both are
    # Shard(0) over the vocabulary, so tying them again is exact.
    model.tie_weights()
