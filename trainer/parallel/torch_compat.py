"""What the oldest torch release the trainer runs on (2.10) lacks, added where it is used.

torch 2.10's DTensor caches the sharding of ``aten.embedding_dense_backward`` by its tensor arguments alone,
leaving out ``num_weights`` (the embedding's row count): two vocabulary-parallel embeddings whose lookups have
the same index shape (a GPT's token and position embeddings at micro-batch 1; BERT's token, position and
token-type embeddings) then share one cached output shape, and the backward fails ("EmbeddingBackward0
returned an invalid gradient ... got [32, 32] but expected shape compatible with [256, 32]"). torch 2.11
registers the op with ``RuntimeSchemaInfo(static_argnum=2)``, which puts ``num_weights`` in the cache key;
`fix_dtensor_embedding_backward` does the same on the releases before it.
"""

from __future__ import annotations

import torch
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._op_schema import RuntimeSchemaInfo

# embedding_dense_backward(grad_output, indices, num_weights, padding_idx, scale_grad_by_freq): the
# arguments from this position on are part of the sharding cache key.
_EMBEDDING_BACKWARD_STATIC_ARGNUM = 2
# The first release whose DTensor keys the embedding backward's sharding by num_weights.
_EMBEDDING_BACKWARD_KEYED_SINCE = "2.11"


def fix_dtensor_embedding_backward() -> None:
    """Key DTensor's cached embedding-backward sharding by the embedding's row count too (torch < 2.11; later
    releases register the op that way themselves, and are left alone)."""
    if torch.__version__ >= _EMBEDDING_BACKWARD_KEYED_SINCE:
        return
    schema_info = DTensor._op_dispatcher.sharding_propagator.op_to_schema_info
    schema_info.setdefault(torch.ops.aten.embedding_dense_backward.default,
                           RuntimeSchemaInfo(static_argnum=_EMBEDDING_BACKWARD_STATIC_ARGNUM))
