"""GPT-2: learned positions, pre-LayerNorm blocks, GELU MLP, output tied to the input embedding.

Written to be split and sharded by PyTorch's own tools:

- blocks live in a ``ModuleDict`` keyed by their global index, so a parameter has the same name in
  every tensor/pipeline layout (``layers.3.attention.wq.weight``) and checkpoints reshard;
- ``tok_embeddings``, ``pos_embeddings``, ``norm`` and ``output`` may be None in a pipeline stage
  that does not own them, and `GPT.forward` skips what is missing;
- q, k and v are separate linears, or with ``fused_qkv`` one ``wqkv`` linear whose output rows are
  laid out per head (`trainer.models.gpt.fused_qkv`); attention infers the local head count from the shape, so
  column-parallel sharding keeps whole heads on each tensor-parallel rank.

Names map one-to-one onto Hugging Face ``GPT2LMHeadModel`` (``tok_embeddings`` = ``wte``,
``pos_embeddings`` = ``wpe``, ``attention_norm`` = ``ln_1``, ``wq|wk|wv`` = ``c_attn`` split in three
and transposed (``wqkv`` holds the same rows reordered per head), ``wo`` = ``attn.c_proj``,
``ffn_norm`` = ``ln_2``, ``w1``/``w2`` = ``mlp.c_fc``/``mlp.c_proj`` transposed, ``norm`` = ``ln_f``,
``output`` = ``lm_head``).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from trainer.parallel.keyed_dropout import OUTSIDE_LAYERS, KeyedDropout, attention, layer_keys
from trainer.models.gpt.fused_qkv import FUSED_WEIGHT, QKV, fuse_qkv
from trainer.moe.layer import MoELayer
from trainer.moe.settings import MoESettings

# The token embedding, and the output head tied to it (under pipelining the last stage's own copy).
TIED_WEIGHT_NAME = "tok_embeddings.weight"
TIED_COPY_NAME = "output.weight"
# The dropout sites of a GPT: the ``site`` coordinate of `trainer.parallel.keyed_dropout`.
EMBEDDING_SITE, ATTENTION_PROBS_SITE, ATTENTION_OUT_SITE, FFN_OUT_SITE = range(4)
# Dims of [batch, heads, q, k] probabilities and [batch, seq, hidden] residuals that parallelism shards.
HEADS_DIM = SEQUENCE_DIM = 1


@dataclass(frozen=True, slots=True)
class GPTShape:
    """Resolved model dimensions (vocabulary already padded)."""

    num_layers: int
    hidden_size: int
    num_attention_heads: int
    ffn_hidden_size: int
    max_position_embeddings: int
    padded_vocab_size: int
    hidden_dropout: float = 0.0
    attention_dropout: float = 0.0
    init_method_std: float = 0.02
    layernorm_epsilon: float = 1e-5
    fused_qkv: bool = False
    """One [3h, h] q/k/v projection instead of three [h, h] ones (compute layout only: checkpoints and
    Hugging Face files hold q, k and v apart either way)."""
    moe: MoESettings | None = None
    """Mixture of experts in place of the MLP of the layers it names (`trainer.moe`); None: dense."""

    def unfused(self) -> GPTShape:
        """This shape with q, k and v apart: the layout of checkpoints and HF conversion."""
        return dataclasses.replace(self, fused_qkv=False)


class Attention(nn.Module):
    """Causal multi-head self-attention."""

    def __init__(self, shape: GPTShape) -> None:
        super().__init__()
        h = shape.hidden_size
        self.head_dim = h // shape.num_attention_heads
        self.fused_qkv = shape.fused_qkv
        if self.fused_qkv:
            self.wqkv = nn.Linear(h, QKV * h)
        else:
            self.wq = nn.Linear(h, h)
            self.wk = nn.Linear(h, h)
            self.wv = nn.Linear(h, h)
        self.wo = nn.Linear(h, h)
        self.attention_dropout = KeyedDropout(shape.attention_dropout, tensor_parallel_dim=HEADS_DIM)

    def forward(self, x: torch.Tensor, kv_cache=None, dropout_keys: torch.Tensor | None = None) -> torch.Tensor:
        """x: [batch, seq, hidden] -> [batch, seq, hidden]; ``dropout_keys``: the block's keyed-dropout keys.

        ``kv_cache`` (generation only): this layer's cache, an object with ``update(k, v) -> (k, v)``
        (appends this call's keys/values [batch, local heads, seq, head_dim] and returns all cached
        ones) and the ``attn_mask``/``is_causal`` arguments of `F.scaled_dot_product_attention`.
        """
        batch, seq, _ = x.shape
        # -1 heads: under tensor parallelism each rank holds hidden/tp columns = heads/tp whole heads.
        if self.fused_qkv:
            # One GEMM; its output columns are [local heads, 3, head_dim] (`trainer.models.gpt.fused_qkv`).
            qkv = self.wqkv(x).view(batch, seq, -1, QKV, self.head_dim)
            q, k, v = (t.transpose(1, 2) for t in qkv.unbind(dim=3))
        else:
            q, k, v = (w(x).view(batch, seq, -1, self.head_dim).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        if kv_cache is None:
            out = attention(q, k, v, None, True, None, self.attention_dropout, dropout_keys, ATTENTION_PROBS_SITE)
        else:
            k, v = kv_cache.update(k, v)
            out = attention(q, k, v, kv_cache.attn_mask, kv_cache.is_causal, None, self.attention_dropout, None,
                            ATTENTION_PROBS_SITE)
        return self.wo(out.transpose(1, 2).reshape(batch, seq, -1))


class FeedForward(nn.Module):
    """GELU MLP (tanh approximation, as GPT-2)."""

    def __init__(self, shape: GPTShape) -> None:
        super().__init__()
        self.w1 = nn.Linear(shape.hidden_size, shape.ffn_hidden_size)
        self.w2 = nn.Linear(shape.ffn_hidden_size, shape.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.gelu(self.w1(x), approximate="tanh"))


def feed_forward(shape: GPTShape, layer_index: int) -> nn.Module:
    """Block ``layer_index``'s MLP: dense, or a mixture of GELU experts (no biases, as Megatron's grouped MLP)."""
    if shape.moe is not None and shape.moe.is_moe_layer(layer_index):
        return MoELayer(shape.hidden_size, shape.ffn_hidden_size, "gelu", shape.moe)
    return FeedForward(shape)


class Block(nn.Module):
    """Pre-LayerNorm transformer block."""

    def __init__(self, shape: GPTShape, layer_index: int = 0) -> None:
        super().__init__()
        self.attention_norm = nn.LayerNorm(shape.hidden_size, eps=shape.layernorm_epsilon)
        self.attention = Attention(shape)
        self.ffn_norm = nn.LayerNorm(shape.hidden_size, eps=shape.layernorm_epsilon)
        self.feed_forward = feed_forward(shape, layer_index)
        self.dropout = KeyedDropout(shape.hidden_dropout, sequence_dim=SEQUENCE_DIM)

    def forward(self, x: torch.Tensor, kv_cache=None, dropout_keys: torch.Tensor | None = None) -> torch.Tensor:
        # By keyword: sequence parallelism's PrepareModuleInput lays out the positional inputs only.
        x = x + self.dropout(self.attention(self.attention_norm(x), kv_cache=kv_cache, dropout_keys=dropout_keys),
                             dropout_keys, ATTENTION_OUT_SITE)
        return x + self.dropout(self.feed_forward(self.ffn_norm(x)), dropout_keys, FFN_OUT_SITE)


class GPT(nn.Module):
    """GPT-2 language model; a pipeline stage is the same class with some parts set to None."""

    def __init__(self, shape: GPTShape) -> None:
        super().__init__()
        self.shape = shape
        self.tok_embeddings: nn.Embedding | None = nn.Embedding(shape.padded_vocab_size, shape.hidden_size)
        self.pos_embeddings: nn.Embedding | None = nn.Embedding(shape.max_position_embeddings, shape.hidden_size)
        self.embedding_dropout: KeyedDropout | None = KeyedDropout(shape.hidden_dropout, sequence_dim=SEQUENCE_DIM)
        self.layers = nn.ModuleDict({str(i): Block(shape, i) for i in range(shape.num_layers)})
        self.norm: nn.LayerNorm | None = nn.LayerNorm(shape.hidden_size, eps=shape.layernorm_epsilon)
        self.output: nn.Linear | None = nn.Linear(shape.hidden_size, shape.padded_vocab_size, bias=False)
        self.checkpoint_activations = False
        self.init_weights()
        self.tie_weights()

    def tie_weights(self) -> None:
        """Share the output projection with the token embedding (when this module holds both)."""
        if self.tok_embeddings is not None and self.output is not None:
            self.output.weight = self.tok_embeddings.weight

    def init_weights(self) -> None:
        """`init_parameter` of every parameter, in `named_parameters` order."""
        for name, param in self.named_parameters():
            self.init_parameter(name, param)

    @torch.no_grad()
    def init_parameter(self, name: str, tensor: torch.Tensor) -> None:
        """Megatron's GPT init of parameter ``name`` into ``tensor`` (the parameter, or a full-size
        stand-in for a sharded one): N(0, std), std/sqrt(2 L) for the residual output projections,
        norms at 1, biases at 0."""
        std = self.shape.init_method_std
        if name.endswith(FUSED_WEIGHT):
            # Drawn as the unfused wq, wk, wv would be, one after the other, then reordered per head: a
            # fused run starts from exactly the unfused run's weights (one [3h, h] draw would not be the
            # concatenation of three [h, h] draws on every device).
            h = self.shape.hidden_size
            parts = [torch.empty(h, h, device=tensor.device).normal_(0.0, std) for _ in range(QKV)]
            tensor.copy_(fuse_qkv(*parts, num_heads=self.shape.num_attention_heads))
        elif name.endswith(("norm.weight",)):
            tensor.fill_(1.0)
        elif name.endswith(".bias"):
            tensor.zero_()
        elif name.endswith(("wo.weight", "w2.weight")):
            tensor.normal_(0.0, std / math.sqrt(2.0 * self.shape.num_layers))
        else:
            tensor.normal_(0.0, std)

    def forward(self, tokens: torch.Tensor, position_ids: torch.Tensor | None = None, kv_cache=None,
                dropout_keys: torch.Tensor | None = None) -> torch.Tensor:
        """Token ids [batch, seq] (or, after the first stage, hidden states [batch, seq, hidden]) ->
        logits [batch, seq, padded_vocab] (or hidden states when this stage has no output head).

        ``dropout_keys`` (training with keyed dropout): int64 [batch] `trainer.parallel.keyed_dropout.sample_keys`.

        ``kv_cache`` (generation only, see `trainer.generation.kv_cache`): ``kv_cache.layer(name)`` is
        block ``name``'s cache; with it the head is applied to the last position only (logits
        [batch, 1, padded_vocab]), which is all incremental decoding reads.
        """
        h = tokens
        if self.tok_embeddings is not None:
            h = self.tok_embeddings(tokens) + self.pos_embeddings(position_ids)
            h = self.embedding_dropout(h, layer_keys(dropout_keys, OUTSIDE_LAYERS), EMBEDDING_SITE)
        if kv_cache is None:
            for name, layer in self.layers.items():
                keys = layer_keys(dropout_keys, int(name))
                # Non-reentrant checkpointing keeps working under DTensor, FSDP2 and the pipeline schedules;
                # the recomputation sees the same keys, so it draws the same masks.
                h = (checkpoint(layer, h, dropout_keys=keys, use_reentrant=False) if self.checkpoint_activations
                     else layer(h, dropout_keys=keys))
        else:
            for name, layer in self.layers.items():
                h = layer(h, kv_cache.layer(name))
            if self.output is not None:
                h = h[:, -1:]
        if self.norm is not None:
            h = self.norm(h)
        if self.output is not None:
            h = self.output(h)
        return h
