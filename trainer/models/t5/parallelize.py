"""Tensor parallelism for `trainer.models.t5.model.T5` (or a pipeline stage of it), like the GPT plan.

    apply_t5_tp(model, mesh["tp"], sequence_parallel)    # heads, MLP, vocabulary and bias tables split

The plan of `trainer.models.gpt.parallelize.apply_tp` carried over to the encoder-decoder: q/k/v (self- and
cross-attention) and the MLP's w1/w3 are column-parallel, the attention and MLP output projections
row-parallel; the token embedding is vocabulary-parallel; the head is column-parallel over the
vocabulary with logits left sharded for ``loss_parallel``. The relative-position bias tables
(``[buckets, heads]``) are column-parallel too, so each rank computes the bias of its own heads.
Cross-attention keys and values are computed from the replicated encoder output. The RMSNorm
weights stay plain replicated tensors (their gradients are identical on every tp rank), so the
optimiser runs its for-loop kernel (`trainer.optim.optimizer.select_adamw_kernel`), as the GPT trainer does under
tensor parallelism.
With ``sequence_parallel`` (GPT's plan): the residual streams of both stacks, the norms and the dropout after them
are sharded along the sequence (dim 1); each attention and MLP all-gathers its input and its output projection
reduce-scatters back to ``Shard(1)``. Cross-attention all-gathers the encoder output (kept sharded, as Megatron
does) for its keys and values, and the head all-gathers the decoder output. The position-bias tables are per
head, not per position, so they are split as without it; attention itself always sees whole sequences.
A mixture-of-experts MLP's router and experts are replicated over tp (`trainer.moe.parallel`).
"""

from __future__ import annotations

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Placement, Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from trainer.models.t5.model import T5
from trainer.moe.layer import MoELayer
from trainer.moe.parallel import replicated_moe_plan


def _attention_plan(prefix: str, residual: Placement) -> dict[str, object]:
    return {f"{prefix}.wq": ColwiseParallel(), f"{prefix}.wk": ColwiseParallel(), f"{prefix}.wv": ColwiseParallel(),
            f"{prefix}.wo": RowwiseParallel(output_layouts=residual)}


def _sequence_parallel_plan(cross_attention: bool) -> dict[str, object]:
    """A block's norms on sequence shards, and the all-gathers of its attention's and MLP's inputs.

    Self-attention takes (x, bias), cross-attention (x, memory bias, memory): x and the memory (the encoder
    output, sharded like the residual stream) are gathered, the biases are whole already.
    """
    gather = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
    plan: dict[str, object] = {
        "attention_norm": SequenceParallel(), "ffn_norm": SequenceParallel(), "feed_forward": gather,
        "attention": PrepareModuleInput(input_layouts=(Shard(1), None), desired_input_layouts=(Replicate(), None))}
    if cross_attention:
        plan["cross_attention_norm"] = SequenceParallel()
        plan["cross_attention"] = PrepareModuleInput(input_layouts=(Shard(1), None, Shard(1)),
                                                     desired_input_layouts=(Replicate(), None, Replicate()))
    return plan


def _feed_forward_plan(block: nn.Module, mlp: dict[str, object], sequence_parallel: bool) -> dict[str, object]:
    """A block's MLP entries: ``mlp`` for a dense one; a mixture of experts stays whole on every rank
    (`trainer.moe.parallel.replicated_moe_plan`; its entry replaces the sequence-parallel input gather)."""
    if isinstance(block.feed_forward, MoELayer):
        return replicated_moe_plan(sequence_parallel)
    return mlp


def apply_t5_tp(model: T5, tp_mesh: DeviceMesh, sequence_parallel: bool = False) -> None:
    """Shard heads, MLP, vocabulary and position-bias tables over ``tp_mesh`` in place; with
    ``sequence_parallel`` also the residual streams, along the sequence (the lengths must divide by the tp size).

    Raises:
        ValueError: the heads, d_ff or vocabulary do not divide by the tp degree.
    """
    tp, shape = tp_mesh.size(), model.shape
    for name, value in (("num_heads", shape.num_heads), ("d_ff", shape.d_ff), ("vocab_size", shape.vocab_size)):
        if value % tp:
            raise ValueError(f"{name} ({value}) is not divisible by the tensor-parallel size ({tp})")
    residual = Shard(1) if sequence_parallel else Replicate()
    plan: dict[str, object] = {}
    if model.shared is not None:
        plan["shared"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=residual)
    if sequence_parallel:
        plan |= {name: SequenceParallel(use_local_output=True) for name in ("encoder_norm", "decoder_norm")
                 if getattr(model, name) is not None}
    for name in ("encoder_position_bias", "decoder_position_bias"):
        if getattr(model, name) is not None:
            plan[f"{name}.embedding"] = ColwiseParallel(input_layouts=Replicate(), output_layouts=Shard(-1))
    if model.output is not None:
        plan["output"] = ColwiseParallel(input_layouts=residual, output_layouts=Shard(-1), use_local_output=False)
    parallelize_module(model, tp_mesh, plan)
    mlp = {"feed_forward.w1": ColwiseParallel(), "feed_forward.w2": RowwiseParallel(output_layouts=residual)}
    if shape.feed_forward == "gated-gelu":
        mlp["feed_forward.w3"] = ColwiseParallel()
    for block in model.encoder_layers.values():
        block_plan = _attention_plan("attention", residual)
        block_plan |= _sequence_parallel_plan(False) if sequence_parallel else {}
        parallelize_module(block, tp_mesh, block_plan | _feed_forward_plan(block, mlp, sequence_parallel))
    for block in model.decoder_layers.values():
        block_plan = _attention_plan("attention", residual) | _attention_plan("cross_attention", residual)
        block_plan |= _sequence_parallel_plan(True) if sequence_parallel else {}
        parallelize_module(block, tp_mesh, block_plan | _feed_forward_plan(block, mlp, sequence_parallel))
    model.sequence_shards = tp if sequence_parallel else 1
    # Distributing replaced the embedding and head weights by two new parameters, both Shard(0) over
    # the vocabulary: tying them again is exact.
    model.tie_weights()
