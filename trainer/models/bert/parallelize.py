"""Tensor parallelism of a BERT (or a pipeline stage of it): BERT's `ParallelPlan.apply_tp`, the GPT plan (`trainer.models.gpt.parallelize`) carried over.

q/k/v and the first MLP linear are column-parallel, the attention and MLP output projections
row-parallel (whole heads per rank); the word embedding is vocabulary-parallel; the MLM decoder is
column-parallel over the vocabulary (weight and bias) with logits left sharded for ``loss_parallel``.
The position and token-type embeddings, the LayerNorms, the MLM transform, the pooler and the binary
head stay plain replicated tensors: they are small, and their gradients are identical on every tp
rank. Sequence parallelism is not implemented for BERT.
"""

from __future__ import annotations

from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from trainer.errors import TrainConfigError
from trainer.models.bert.model import Bert

BLOCK_PLAN = {"attention.wq": ColwiseParallel, "attention.wk": ColwiseParallel, "attention.wv": ColwiseParallel,
              "attention.wo": RowwiseParallel, "feed_forward.w1": ColwiseParallel, "feed_forward.w2": RowwiseParallel}


def apply_tp(model: Bert, tp_mesh: DeviceMesh, sequence_parallel: bool) -> None:
    """Shard heads, MLP and vocabulary over ``tp_mesh`` in place.

    Raises:
        TrainConfigError: sequence parallelism asked for, or heads, MLP width or vocabulary not divisible by tp.
    """
    if sequence_parallel:
        raise TrainConfigError("sequence_parallel is not implemented for model bert")
    tp, shape = tp_mesh.size(), model.shape
    for name in ("num_attention_heads", "ffn_hidden_size", "padded_vocab_size"):
        if getattr(shape, name) % tp:
            raise TrainConfigError(f"{name} ({getattr(shape, name)}) is not divisible by the tensor-parallel "
                                   f"size ({tp})")
    plan: dict[str, object] = {}
    if model.word_embeddings is not None:
        plan["word_embeddings"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate())
    if model.lm_head is not None:
        plan["lm_head.decoder"] = ColwiseParallel(output_layouts=Shard(-1), use_local_output=False)
    parallelize_module(model, tp_mesh, plan)
    for block in model.layers.values():
        parallelize_module(block, tp_mesh, {name: style() for name, style in BLOCK_PLAN.items()})
    # Distributing replaced the embedding and decoder weights by two new parameters, both Shard(0) over the
    # vocabulary: tying them again is exact.
    model.tie_weights()
