"""The GPT decoder: GPT-2 (learned positions, pre-LayerNorm blocks, GELU MLP, output tied to the input
embedding) with megatron-core's options for Llama-class models, all off for GPT-2 (`GPTShape`): RMSNorm and
zero-centred norms (`trainer.models.gpt.norms`), SwiGLU, rotary positions (`trainer.models.gpt.rotary`) or none,
grouped-query attention (``num_query_groups`` key/value heads), ``kv_channels`` per head, no biases or q/k/v
biases only, q/k norms per head, an untied output head. One attention, one MLP, one KV cache path for all.

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
import functools
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from trainer.parallel.keyed_dropout import OUTSIDE_LAYERS, KeyedDropout, attention, layer_keys
from trainer.parallel.recompute import RECOMPUTE_CORE_ATTENTION, core_attention, run_layers
from trainer.models.gpt.fused_qkv import FUSED_WEIGHT, fuse_qkv
from trainer.models.gpt.norms import build_norm
from trainer.models.gpt.rotary import RotarySettings, apply_rotary, rotary_tables
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
    # Megatron's TransformerConfig options for Llama-class models; the defaults are GPT-2.
    normalization: str = "LayerNorm"
    """LayerNorm or RMSNorm: every norm of the model (blocks, final, q/k)."""
    apply_layernorm_1p: bool = False
    """Norm weights zero-centred: scale 1 + weight, weight initialised to 0."""
    swiglu: bool = False
    """MLP w2(silu(w1 x) * w3 x) (w1 the gate, w3 the up projection) instead of w2(gelu(w1 x))."""
    position_embedding_type: str = "learned_absolute"
    """learned_absolute (a ``pos_embeddings`` table), rope (rotary q and k) or none."""
    rotary_base: int = 10000
    """Base of the rotary frequencies (an integer, as Megatron's --rotary-base)."""
    rotary_percent: float = 1.0
    """Fraction of each head's channels that rope rotates."""
    rotary_interpolation_factor: float | None = None
    """Linear rope scaling: positions divided by this factor."""
    rope_scaling_factor: float | None = None
    """Llama 3.1's rope frequency scaling with this factor; None: off."""
    rope_low_freq_factor: float = 1.0
    rope_high_freq_factor: float = 4.0
    rope_original_max_positions: int = 8192
    """Llama 3.1's scaling constants (Megatron's fixed values; Hugging Face's ``rope_scaling`` gives them)."""
    num_query_groups: int | None = None
    """Key/value heads (grouped-query attention); None: one per query head."""
    kv_channels: int | None = None
    """Channels per head; None: hidden_size / num_attention_heads."""
    add_bias_linear: bool = True
    """Biases in the attention and MLP linears."""
    add_qkv_bias: bool = False
    """Biases on q, k and v whatever ``add_bias_linear`` says (Qwen2)."""
    qk_layernorm: bool = False
    """Norm q and k per head (``attention.q_layernorm``/``k_layernorm``, weight [head_dim]) before rope."""
    untie_embeddings_and_output_weights: bool = False
    """``output.weight`` a parameter of its own."""

    def unfused(self) -> GPTShape:
        """This shape with q, k and v apart: the layout of checkpoints and HF conversion."""
        return dataclasses.replace(self, fused_qkv=False)

    @property
    def head_dim(self) -> int:
        return self.kv_channels or self.hidden_size // self.num_attention_heads

    @property
    def query_groups(self) -> int:
        """Key/value heads G (H for multi-head attention)."""
        return self.num_query_groups or self.num_attention_heads

    @property
    def qkv_bias(self) -> bool:
        return self.add_bias_linear or self.add_qkv_bias

    @property
    def tied(self) -> bool:
        return not self.untie_embeddings_and_output_weights

    def rotary(self) -> RotarySettings | None:
        """The rotary tables' settings; None without rope."""
        if self.position_embedding_type != "rope":
            return None
        return RotarySettings(head_dim=self.head_dim, base=self.rotary_base, percent=self.rotary_percent,
                              interpolation_factor=self.rotary_interpolation_factor,
                              llama3_factor=self.rope_scaling_factor,
                              llama3_low_freq_factor=self.rope_low_freq_factor,
                              llama3_high_freq_factor=self.rope_high_freq_factor,
                              llama3_original_max_positions=self.rope_original_max_positions)

    def norm(self, size: int | None = None) -> nn.Module:
        """A fresh norm of this model's kind over ``size`` channels (default hidden_size)."""
        return build_norm(self.normalization, size or self.hidden_size, self.layernorm_epsilon,
                          self.apply_layernorm_1p)


# The `GPTShape` fields of the Llama-class options (all at their defaults: GPT-2).
DECODER_OPTIONS = ("normalization", "apply_layernorm_1p", "swiglu", "position_embedding_type", "rotary_base",
                   "rotary_percent", "rotary_interpolation_factor", "rope_scaling_factor", "rope_low_freq_factor",
                   "rope_high_freq_factor", "rope_original_max_positions", "num_query_groups", "kv_channels",
                   "add_bias_linear", "add_qkv_bias", "qk_layernorm", "untie_embeddings_and_output_weights")

Rope = tuple[torch.Tensor, torch.Tensor]
"""cos and sin tables, float32 [batch, seq, rotary dim] (`trainer.models.gpt.rotary.rotary_tables`)."""


class Attention(nn.Module):
    """Causal self-attention: H query heads over G key/value groups (G = H: multi-head; G = 1: multi-query)."""

    def __init__(self, shape: GPTShape) -> None:
        super().__init__()
        h, d = shape.hidden_size, shape.head_dim
        self.head_dim = d
        self.heads_per_group = shape.num_attention_heads // shape.query_groups
        q_size, kv_size = shape.num_attention_heads * d, shape.query_groups * d
        self.fused_qkv = shape.fused_qkv
        if self.fused_qkv:
            self.wqkv = nn.Linear(h, q_size + 2 * kv_size, bias=shape.qkv_bias)
        else:
            self.wq = nn.Linear(h, q_size, bias=shape.qkv_bias)
            self.wk = nn.Linear(h, kv_size, bias=shape.qkv_bias)
            self.wv = nn.Linear(h, kv_size, bias=shape.qkv_bias)
        if shape.qk_layernorm:
            self.q_layernorm = shape.norm(d)
            self.k_layernorm = shape.norm(d)
        self.qk_layernorm = shape.qk_layernorm
        self.rotary = shape.rotary()
        self.wo = nn.Linear(q_size, h, bias=shape.add_bias_linear)
        self.attention_dropout = KeyedDropout(shape.attention_dropout, tensor_parallel_dim=HEADS_DIM)
        setattr(self, RECOMPUTE_CORE_ATTENTION, False)
        # `trainer.parallel.context.apply_cp` sets the run's cp group here (None: no context parallelism).
        self.context_parallel = None

    @property
    def compile_parts_only(self) -> bool:
        """Under context parallelism `trainer.parallel.parallelize.apply_compile` leaves this forward eager and
        compiles the projections and norms inside (torchtitan's rule for MoE dispatch): the gathers, the blocks
        and the backward that runs them again are Python of their own, not one graph."""
        return self.context_parallel is not None

    def forward(self, x: torch.Tensor, kv_cache=None, dropout_keys: torch.Tensor | None = None,
                rope: Rope | None = None, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """x: [batch, seq, hidden] -> [batch, seq, hidden]; ``dropout_keys``: the block's keyed-dropout keys;
        ``rope``: the rotary tables of x's positions (None without rope); ``attention_mask``: bool [batch, 1,
        seq, seq], True = masked (--reset-attention-mask's document mask, causal within), None: causal.

        ``kv_cache`` (generation only): this layer's cache, an object with ``update(k, v) -> (k, v)``
        (appends this call's keys/values [batch, local groups, seq, head_dim], after rope, and returns all
        cached ones) and the ``attn_mask``/``is_causal`` arguments of `F.scaled_dot_product_attention`.
        """
        batch, seq, _ = x.shape
        # -1 groups: under tensor parallelism each rank holds whole heads and whole groups (G/tp of them).
        if self.fused_qkv:
            # One GEMM; its output columns are [local groups, H/G + 2, head_dim] (`trainer.models.gpt.fused_qkv`).
            qkv = self.wqkv(x).view(batch, seq, -1, self.heads_per_group + 2, self.head_dim)
            q, k, v = qkv.split([self.heads_per_group, 1, 1], dim=3)
            q, k, v = (t.reshape(batch, seq, -1, self.head_dim).transpose(1, 2) for t in (q, k, v))
        else:
            q, k, v = (w(x).view(batch, seq, -1, self.head_dim).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        if self.qk_layernorm:
            q, k = self.q_layernorm(q), self.k_layernorm(k)
        if self.rotary is not None:
            rope = rope if rope is not None else self.default_rope(batch, seq, x.device)
            q, k = apply_rotary(q, *rope), apply_rotary(k, *rope)
        if self.context_parallel is not None:
            # This rank holds 2 chunks of each sequence: its queries attend the whole sequence's keys/values
            # (gathered as groups, before the repeat over heads) under the causal mask of the true positions,
            # recomputed in the backward (selective recompute of the core attention included).
            out = self.context_parallel.attention(q, k, v, self.heads_per_group, functools.partial(
                attention, is_causal=False, scale=None, dropout=self.attention_dropout, keys=dropout_keys,
                site=ATTENTION_PROBS_SITE))
            return self.wo(out.transpose(1, 2).reshape(batch, seq, -1))
        if kv_cache is not None:
            k, v = kv_cache.update(k, v)
        if self.heads_per_group > 1:
            # Each group's key/value head serves its H/G consecutive query heads (Megatron's and HF's order);
            # the cache above holds the groups only.
            k, v = (t.repeat_interleave(self.heads_per_group, dim=1) for t in (k, v))
        if kv_cache is None:
            # The document mask holds the causal one; as an additive mask of the scores' dtype (what SDPA and
            # the keyed-dropout path both take).
            additive = None if attention_mask is None else \
                torch.zeros(attention_mask.shape, dtype=q.dtype, device=q.device).masked_fill(attention_mask,
                                                                                              float("-inf"))
            out = core_attention(self, attention, q, k, v, additive, additive is None, None, self.attention_dropout,
                                 dropout_keys, ATTENTION_PROBS_SITE)
        else:
            out = attention(q, k, v, kv_cache.attn_mask, kv_cache.is_causal, None, self.attention_dropout, None,
                            ATTENTION_PROBS_SITE)
        return self.wo(out.transpose(1, 2).reshape(batch, seq, -1))


    def default_rope(self, batch: int, seq: int, device: torch.device) -> Rope:
        """The rotary tables of positions 0..seq-1 (this rank's chunks' positions under context parallelism), for
        a forward without position ids (a later pipeline stage). ``seq`` is the attention's own, whole sequence
        (sequence parallelism gathers it before attention; the stage's input holds 1/tp of it). Training positions
        are 0..seq-1 in every row, as Megatron's rope always takes them."""
        positions = torch.arange(seq, device=device) if self.context_parallel is None else \
            self.context_parallel.local_positions(seq, device)
        return rotary_tables(self.rotary, positions.expand(batch, seq))


class FeedForward(nn.Module):
    """GELU MLP (tanh approximation, as GPT-2), or SwiGLU: w2(silu(w1 x) * w3 x)."""

    def __init__(self, shape: GPTShape) -> None:
        super().__init__()
        bias = shape.add_bias_linear
        self.w1 = nn.Linear(shape.hidden_size, shape.ffn_hidden_size, bias=bias)
        if shape.swiglu:
            self.w3 = nn.Linear(shape.hidden_size, shape.ffn_hidden_size, bias=bias)
        self.swiglu = shape.swiglu
        self.w2 = nn.Linear(shape.ffn_hidden_size, shape.hidden_size, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.swiglu:
            return self.w2(F.silu(self.w1(x)) * self.w3(x))
        return self.w2(F.gelu(self.w1(x), approximate="tanh"))


def feed_forward(shape: GPTShape, layer_index: int) -> nn.Module:
    """Block ``layer_index``'s MLP: dense, or a mixture of GELU (SwiGLU) experts (no biases, as Megatron's
    grouped MLP)."""
    if shape.moe is not None and shape.moe.is_moe_layer(layer_index):
        return MoELayer(shape.hidden_size, shape.ffn_hidden_size, "swiglu" if shape.swiglu else "gelu", shape.moe)
    return FeedForward(shape)


class Block(nn.Module):
    """Pre-LayerNorm transformer block."""

    def __init__(self, shape: GPTShape, layer_index: int = 0) -> None:
        super().__init__()
        self.attention_norm = shape.norm()
        self.attention = Attention(shape)
        self.ffn_norm = shape.norm()
        self.feed_forward = feed_forward(shape, layer_index)
        self.dropout = KeyedDropout(shape.hidden_dropout, sequence_dim=SEQUENCE_DIM)

    def forward(self, x: torch.Tensor, kv_cache=None, dropout_keys: torch.Tensor | None = None,
                rope: Rope | None = None, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        # By keyword: sequence parallelism's PrepareModuleInput lays out the positional inputs only.
        x = x + self.dropout(self.attention(self.attention_norm(x), kv_cache=kv_cache, dropout_keys=dropout_keys,
                                            rope=rope, attention_mask=attention_mask),
                             dropout_keys, ATTENTION_OUT_SITE)
        return x + self.dropout(self.feed_forward(self.ffn_norm(x)), dropout_keys, FFN_OUT_SITE)


class GPT(nn.Module):
    """GPT language model; a pipeline stage is the same class with some parts set to None."""

    def __init__(self, shape: GPTShape) -> None:
        super().__init__()
        self.shape = shape
        self.tok_embeddings: nn.Embedding | None = nn.Embedding(shape.padded_vocab_size, shape.hidden_size)
        self.pos_embeddings: nn.Embedding | None = (
            nn.Embedding(shape.max_position_embeddings, shape.hidden_size)
            if shape.position_embedding_type == "learned_absolute" else None)
        self.embedding_dropout: KeyedDropout | None = KeyedDropout(shape.hidden_dropout, sequence_dim=SEQUENCE_DIM)
        self.layers = nn.ModuleDict({str(i): Block(shape, i) for i in range(shape.num_layers)})
        self.norm: nn.Module | None = shape.norm()
        self.output: nn.Linear | None = nn.Linear(shape.hidden_size, shape.padded_vocab_size, bias=False)
        self.checkpoint_activations = False
        self.init_weights()
        self.tie_weights()

    def tie_weights(self) -> None:
        """Share the output projection with the token embedding (when this module holds both and they are tied)."""
        if self.shape.tied and self.tok_embeddings is not None and self.output is not None:
            self.output.weight = self.tok_embeddings.weight

    def init_weights(self) -> None:
        """`init_parameter` of every parameter, in `named_parameters` order."""
        for name, param in self.named_parameters():
            self.init_parameter(name, param)

    @torch.no_grad()
    def init_parameter(self, name: str, tensor: torch.Tensor) -> None:
        """Megatron's GPT init of parameter ``name`` into ``tensor`` (the parameter, or a full-size
        stand-in for a sharded one): N(0, std), std/sqrt(2 L) for the residual output projections,
        norms at 1 (zero-centred norms at 0), biases at 0."""
        shape = self.shape
        std = shape.init_method_std
        if name.endswith(FUSED_WEIGHT):
            # Drawn as the unfused wq, wk, wv would be, one after the other, then reordered per group: a
            # fused run starts from exactly the unfused run's weights (one [(H + 2G) d, h] draw would not be
            # the concatenation of three draws on every device).
            q_rows, kv_rows = shape.num_attention_heads * shape.head_dim, shape.query_groups * shape.head_dim
            parts = [torch.empty(rows, shape.hidden_size, device=tensor.device).normal_(0.0, std)
                     for rows in (q_rows, kv_rows, kv_rows)]
            tensor.copy_(fuse_qkv(*parts, num_heads=shape.num_attention_heads, num_groups=shape.query_groups))
        elif name.endswith(("norm.weight",)):
            tensor.fill_(0.0 if shape.apply_layernorm_1p else 1.0)
        elif name.endswith(".bias"):
            tensor.zero_()
        elif name.endswith(("wo.weight", "w2.weight")):
            tensor.normal_(0.0, std / math.sqrt(2.0 * self.shape.num_layers))
        else:
            tensor.normal_(0.0, std)

    def forward(self, tokens: torch.Tensor, position_ids: torch.Tensor | None = None, kv_cache=None,
                dropout_keys: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Token ids [batch, seq] (or, after the first stage, hidden states [batch, seq, hidden]) ->
        logits [batch, seq, padded_vocab] (or hidden states when this stage has no output head).

        ``attention_mask`` (--reset-attention-mask): bool [batch, 1, seq, seq], True = masked; None: causal.

        ``dropout_keys`` (training with keyed dropout): int64 [batch] `trainer.parallel.keyed_dropout.sample_keys`.

        ``kv_cache`` (generation only, see `trainer.generation.kv_cache`): ``kv_cache.layer(name)`` is
        block ``name``'s cache; with it the head is applied to the last position only (logits
        [batch, 1, padded_vocab]), which is all incremental decoding reads.
        """
        h = tokens
        if self.tok_embeddings is not None:
            h = self.tok_embeddings(tokens)
            if self.pos_embeddings is not None:
                h = h + self.pos_embeddings(position_ids)
            h = self.embedding_dropout(h, layer_keys(dropout_keys, OUTSIDE_LAYERS), EMBEDDING_SITE)
        rope = self._rope(h, position_ids)
        if kv_cache is None:
            # A recomputed layer sees the same keys, so it draws the same masks.
            calls = [functools.partial(layer, dropout_keys=layer_keys(dropout_keys, int(name)), rope=rope,
                                       attention_mask=attention_mask)
                     for name, layer in self.layers.items()]
            h = run_layers(calls, h, self.checkpoint_activations)
        else:
            for name, layer in self.layers.items():
                h = layer(h, kv_cache.layer(name), rope=rope)
            if self.output is not None:
                h = h[:, -1:]
        if self.norm is not None:
            h = self.norm(h)
        if self.output is not None:
            h = self.output(h)
        return h

    def _rope(self, h: torch.Tensor, position_ids: torch.Tensor | None) -> Rope | None:
        """The rotary tables of ``position_ids`` (None without rope, or without position ids: a later pipeline
        stage, whose attention layers take their own sequence's positions, `Attention.default_rope`)."""
        settings = self.shape.rotary()
        if settings is None or position_ids is None:
            return None
        return rotary_tables(settings, position_ids)
