"""Tensor and data parallelism for `trainer.models.t5.model.T5` (or a pipeline stage of it), like the GPT plan.

    apply_t5_tp(model, mesh["tp"])                       # heads, MLP, vocabulary and bias tables split
    apply_t5_fsdp(model, mesh["dp"], reshard_after_forward=True)

The plan of `trainer.models.gpt.parallelize.apply_tp` carried over to the encoder-decoder: q/k/v (self- and
cross-attention) and the MLP's w1/w3 are column-parallel, the attention and MLP output projections
row-parallel; the token embedding is vocabulary-parallel; the head is column-parallel over the
vocabulary with logits left sharded for ``loss_parallel``. The relative-position bias tables
(``[buckets, heads]``) are column-parallel too, so each rank computes the bias of its own heads.
Cross-attention keys and values are computed from the replicated encoder output. The RMSNorm
weights stay plain replicated tensors (their gradients are identical on every tp rank), so the
optimiser runs its for-loop kernel (`trainer.optim.select_adamw_kernel`), as the GPT trainer does under
tensor parallelism.
Sequence parallelism is not implemented for T5.
"""

from __future__ import annotations

from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import OffloadPolicy, fully_shard
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from trainer.models.t5.model import T5


def _attention_plan(prefix: str) -> dict[str, object]:
    return {f"{prefix}.wq": ColwiseParallel(), f"{prefix}.wk": ColwiseParallel(), f"{prefix}.wv": ColwiseParallel(),
            f"{prefix}.wo": RowwiseParallel()}


def apply_t5_tp(model: T5, tp_mesh: DeviceMesh) -> None:
    """Shard heads, MLP, vocabulary and position-bias tables over ``tp_mesh`` in place.

    Raises:
        ValueError: the heads, d_ff or vocabulary do not divide by the tp degree.
    """
    tp, shape = tp_mesh.size(), model.shape
    for name, value in (("num_heads", shape.num_heads), ("d_ff", shape.d_ff), ("vocab_size", shape.vocab_size)):
        if value % tp:
            raise ValueError(f"{name} ({value}) is not divisible by the tensor-parallel size ({tp})")
    plan: dict[str, object] = {}
    if model.shared is not None:
        plan["shared"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate())
    for name in ("encoder_position_bias", "decoder_position_bias"):
        if getattr(model, name) is not None:
            plan[f"{name}.embedding"] = ColwiseParallel(input_layouts=Replicate(), output_layouts=Shard(-1))
    if model.output is not None:
        plan["output"] = ColwiseParallel(output_layouts=Shard(-1), use_local_output=False)
    parallelize_module(model, tp_mesh, plan)
    mlp = {"feed_forward.w1": ColwiseParallel(), "feed_forward.w2": RowwiseParallel()}
    if shape.feed_forward == "gated-gelu":
        mlp["feed_forward.w3"] = ColwiseParallel()
    for block in model.encoder_layers.values():
        parallelize_module(block, tp_mesh, _attention_plan("attention") | mlp)
    for block in model.decoder_layers.values():
        parallelize_module(block, tp_mesh, _attention_plan("attention") | _attention_plan("cross_attention") | mlp)
    # Distributing replaced the embedding and head weights by two new parameters, both Shard(0) over
    # the vocabulary: tying them again is exact.
    model.tie_weights()


def apply_t5_fsdp(model: T5, dp_mesh: DeviceMesh, reshard_after_forward: bool,
                  offload_policy: OffloadPolicy | None = None) -> None:
    """FSDP2: one parameter group per encoder and decoder block, the rest in the root group.

    ``reshard_after_forward``: ZeRO-3 (True) or ZeRO-2 (False, FSDP2's SHARD_GRAD_OP; `trainer.zero`);
    ``offload_policy``: FSDP2's `CPUOffloadPolicy` keeps the shards and the optimiser step on the CPU.
    """
    offload_policy = offload_policy or OffloadPolicy()  # fully_shard's default: no offload
    for block in (*model.encoder_layers.values(), *model.decoder_layers.values()):
        fully_shard(block, mesh=dp_mesh, reshard_after_forward=reshard_after_forward,
                    offload_policy=offload_policy)
    fully_shard(model, mesh=dp_mesh, reshard_after_forward=reshard_after_forward,
                offload_policy=offload_policy)
