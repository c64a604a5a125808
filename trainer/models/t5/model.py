"""T5 and mT5 encoder-decoder: relative position buckets, RMSNorm without bias, ReLU or gated-GELU MLP.

    shape = T5Shape(vocab_size=32128, d_model=512, d_kv=64, d_ff=2048, num_heads=8,
                    num_encoder_layers=6, num_decoder_layers=6)                     # T5 v1.0 small
    model = T5(shape)
    logits = model(encoder_input_ids, decoder_input_ids, encoder_attention_mask)  # [batch, Ld, vocab]

Variants (Hugging Face config fields in brackets):
- v1.0: ReLU MLP (``feed_forward="relu"``), LM head tied to the token embedding, decoder output scaled
  by d_model**-0.5 before the head (``tie_word_embeddings`` and ``scale_decoder_outputs`` True).
- v1.1 and mT5: gated-GELU MLP (tanh GELU of ``w1 x`` times ``w3 x``), untied head, no scaling.

Written to be split and sharded like `trainer.models.gpt.model.GPT`: blocks live in ``ModuleDict``s keyed by
their index (``encoder_layers.3.attention.wq.weight`` in every layout); q, k and v are separate
linears and attention infers its local head count from the shape, so column-parallel sharding keeps
whole heads (the relative-position bias tables are sharded over heads the same way); top-level parts
may be None in a stage that does not own them. Attention scores are not scaled by 1/sqrt(d_kv) (T5
folds that into the initialisation), and the position bias is computed once per stack (HF: in
block 0) and added in every layer.

Names map one-to-one onto Hugging Face ``T5ForConditionalGeneration`` (see `trainer.models.t5.hf`).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from trainer.models.t5.settings import FEED_FORWARD_KINDS
from trainer.parallel.keyed_dropout import OUTSIDE_LAYERS, KeyedDropout, attention, layer_keys
from trainer.parallel.recompute import RECOMPUTE_CORE_ATTENTION, core_attention, run_layers
from trainer.moe.layer import MoELayer
from trainer.moe.settings import MoESettings
from trainer.parallel.pipeline import settled



@dataclass(frozen=True, slots=True)
class T5Shape:
    """Model dimensions and variant switches (vocabulary already padded)."""

    vocab_size: int
    d_model: int
    """Hidden size."""
    d_kv: int
    """Channels per attention head (Megatron's kv_channels); heads x d_kv need not equal d_model."""
    d_ff: int
    """Feed-forward hidden size (Megatron's ffn_hidden_size)."""
    num_heads: int
    num_encoder_layers: int
    num_decoder_layers: int
    feed_forward: str = "relu"
    """"relu" (T5 v1.0) or "gated-gelu" (v1.1, mT5)."""
    tie_word_embeddings: bool = True
    """The LM head shares the token embedding's weight."""
    scale_decoder_outputs: bool = True
    """Multiply the decoder output by d_model**-0.5 before the head (T5 v1.0 with a tied head)."""
    relative_attention_num_buckets: int = 32
    relative_attention_max_distance: int = 128
    layer_norm_epsilon: float = 1e-6
    dropout_rate: float = 0.0
    initializer_factor: float = 1.0
    """Scales every initial standard deviation (Hugging Face's initializer_factor)."""
    moe: MoESettings | None = None
    """Mixture of experts in place of the MLP of the layers it names, in each stack (`trainer.moe`); None: dense."""

    def __post_init__(self) -> None:
        if self.feed_forward not in FEED_FORWARD_KINDS:
            raise ValueError(f"feed_forward must be one of {FEED_FORWARD_KINDS}, got {self.feed_forward!r}")


# The dropout sites of a T5, the ``site`` coordinate of `trainer.parallel.keyed_dropout`: outside the blocks, then in one.
(ENCODER_EMBEDDING_SITE, DECODER_EMBEDDING_SITE, ENCODER_OUTPUT_SITE, DECODER_OUTPUT_SITE,
 SELF_ATTENTION_PROBS_SITE, SELF_ATTENTION_OUT_SITE, CROSS_ATTENTION_PROBS_SITE, CROSS_ATTENTION_OUT_SITE,
 FFN_HIDDEN_SITE, FFN_OUT_SITE) = range(10)
# The dims tensor parallelism shards: heads of [batch, heads, q, k] probabilities, features of the MLP's hidden;
# the dim sequence parallelism shards: positions of the residual streams' [batch, seq, d_model].
HEADS_DIM, FEATURE_DIM, SEQUENCE_DIM = 1, -1, 1


def relative_position_bucket(relative_position: torch.Tensor, bidirectional: bool, num_buckets: int,
                             max_distance: int) -> torch.Tensor:
    """Bucket of each relative position (key position minus query position), Mesh TensorFlow's rule.

    Half of the buckets (per direction when bidirectional) hold exact distances 0, 1, ...; the rest
    cover distances up to ``max_distance`` on a log scale; farther distances share the last bucket.
    A causal (unidirectional) stack maps every key after the query to bucket 0 (they are masked).

    Args:
        relative_position: int64, any shape.

    Returns:
        int64 of the same shape, in [0, num_buckets).
    """
    buckets = torch.zeros_like(relative_position)
    if bidirectional:
        num_buckets //= 2
        buckets += (relative_position > 0).long() * num_buckets
        distance = relative_position.abs()
    else:
        distance = (-relative_position).clamp(min=0)
    max_exact = num_buckets // 2
    is_small = distance < max_exact
    # float32 log as Mesh TensorFlow and Hugging Face compute it: bucket boundaries must agree exactly.
    large = max_exact + (torch.log(distance.float() / max_exact) / math.log(max_distance / max_exact)
                         * (num_buckets - max_exact)).long()
    large = large.clamp(max=num_buckets - 1)
    return buckets + torch.where(is_small, distance, large)


class RelativePositionBias(nn.Module):
    """Learned scalar bias per (bucket, head), added to the attention scores of every layer of a stack."""

    def __init__(self, shape: T5Shape, bidirectional: bool) -> None:
        super().__init__()
        self.embedding = nn.Embedding(shape.relative_attention_num_buckets, shape.num_heads)
        self.bidirectional = bidirectional
        self.num_buckets = shape.relative_attention_num_buckets
        self.max_distance = shape.relative_attention_max_distance

    def rows(self) -> torch.Tensor:
        """The table, one row per bucket: float [buckets, heads (local under tensor parallelism)].

        What a pipeline stage sends on in place of a bias: a few hundred numbers instead of
        [batch, heads, L, L] per micro-batch (`position_bias` turns them into the bias where needed).
        """
        return self.embedding(torch.arange(self.num_buckets, device=self.embedding.weight.device))

    def forward(self, query_length: int, key_length: int, query_offset: int = 0) -> torch.Tensor:
        """Bias [1, heads (local under tensor parallelism), query_length, key_length] (float).

        ``query_offset``: absolute position of the first query (incremental decoding).
        """
        return position_bias(self.rows(), self.bidirectional, self.max_distance, query_length, key_length,
                             query_offset)


def position_bias(rows: torch.Tensor, bidirectional: bool, max_distance: int, query_length: int, key_length: int,
                  query_offset: int = 0) -> torch.Tensor:
    """The relative-position bias of ``query_length`` queries (from ``query_offset``) over ``key_length`` keys.

    Args:
        rows: `RelativePositionBias.rows`, float [buckets, heads].

    Returns:
        [1, heads, query_length, key_length], rows' dtype, contiguous.
    """
    # A bias depends on the key's distance from the query only: each of the query_length + key_length - 1
    # distances is looked up once, and the [queries, keys] matrix is that table's overlapping windows. Indexing
    # ``rows`` by the whole [queries, keys] bucket matrix instead sends the backward through index_put's
    # accumulation, which on CUDA adds the query_length * key_length / buckets gradients of each bucket one after
    # another: 18 ms a step of mT5-base at 512 positions on an H200, a fifth of its kernel time (profile_t5).
    nearest = -(query_offset + query_length - 1)  # key 0 from the last query
    distance = torch.arange(nearest, key_length - query_offset, device=rows.device)
    table = rows[relative_position_bucket(distance, bidirectional, rows.shape[0], max_distance)]
    # Window i of the table holds the distances of query query_length - 1 - i to keys 0, 1, ...
    windows = table.unfold(0, key_length, 1)  # [query_length, heads, key_length], last query first
    # Contiguous: flip keeps the windows' stride of `heads` in the last dimension, and on CUDA SDPA's fused
    # kernels refuse a mask strided there (the CPU's take it), leaving the math path, which computes in float32.
    # Of the fused kernels only the memory-efficient one takes a mask that requires a gradient, as this one does.
    return windows.flip(0).transpose(0, 1).unsqueeze(0).contiguous()


class Attention(nn.Module):
    """Multi-head attention without score scaling; self-attention, or cross-attention over ``memory``."""

    def __init__(self, shape: T5Shape) -> None:
        super().__init__()
        inner = shape.num_heads * shape.d_kv
        self.head_dim = shape.d_kv
        self.wq = nn.Linear(shape.d_model, inner, bias=False)
        self.wk = nn.Linear(shape.d_model, inner, bias=False)
        self.wv = nn.Linear(shape.d_model, inner, bias=False)
        self.wo = nn.Linear(inner, shape.d_model, bias=False)
        self.dropout = KeyedDropout(shape.dropout_rate, tensor_parallel_dim=HEADS_DIM)
        setattr(self, RECOMPUTE_CORE_ATTENTION, False)

    def heads(self, linear: nn.Linear, x: torch.Tensor) -> torch.Tensor:
        """[batch, seq, d_model] -> [batch, local heads, seq, d_kv]."""
        batch, seq, _ = x.shape
        # -1 heads: under tensor parallelism each rank holds heads/tp whole heads.
        return linear(x).view(batch, seq, -1, self.head_dim).transpose(1, 2)

    def forward(self, x: torch.Tensor, bias: torch.Tensor | None, memory: torch.Tensor | None = None,
                cache: dict | None = None, dropout_keys: torch.Tensor | None = None,
                dropout_site: int = SELF_ATTENTION_PROBS_SITE) -> torch.Tensor:
        """x: [batch, q, d_model]; bias: additive [1 or batch, heads or 1, q or 1, k] (position bias
        and/or mask) or None; ``dropout_keys``/``dropout_site``: the probabilities' keyed dropout.

        ``cache`` (generation only): this layer's dict; self-attention appends its keys/values under
        "k"/"v", cross-attention computes the memory's keys/values once and keeps them.
        """
        batch, seq, _ = x.shape
        q = self.heads(self.wq, x)
        if memory is not None and cache is not None and "k" in cache:
            k, v = cache["k"], cache["v"]
        else:
            source = x if memory is None else memory
            k, v = self.heads(self.wk, source), self.heads(self.wv, source)
            if cache is not None:
                if memory is None and "k" in cache:
                    k, v = torch.cat([cache["k"], k], dim=2), torch.cat([cache["v"], v], dim=2)
                cache["k"], cache["v"] = k, v
        mask = None if bias is None else bias.to(q.dtype)
        out = core_attention(self, attention, q, k, v, mask, False, 1.0, self.dropout, dropout_keys, dropout_site)
        return self.wo(out.transpose(1, 2).reshape(batch, seq, -1))


class FeedForward(nn.Module):
    """ReLU MLP (w2(relu(w1 x))) or gated GELU (w2(gelu_tanh(w1 x) * w3 x)); no biases."""

    def __init__(self, shape: T5Shape) -> None:
        super().__init__()
        self.w1 = nn.Linear(shape.d_model, shape.d_ff, bias=False)
        self.w3 = nn.Linear(shape.d_model, shape.d_ff, bias=False) if shape.feed_forward == "gated-gelu" else None
        self.w2 = nn.Linear(shape.d_ff, shape.d_model, bias=False)
        self.dropout = KeyedDropout(shape.dropout_rate, tensor_parallel_dim=FEATURE_DIM)

    def forward(self, x: torch.Tensor, dropout_keys: torch.Tensor | None = None) -> torch.Tensor:
        if self.w3 is None:
            hidden = F.relu(self.w1(x))
        else:
            hidden = F.gelu(self.w1(x), approximate="tanh") * self.w3(x)
        return self.w2(self.dropout(hidden, dropout_keys, FFN_HIDDEN_SITE))


def _norm(shape: T5Shape) -> nn.RMSNorm:
    """T5LayerNorm: x / sqrt(mean(x^2) + eps) * weight, no mean subtraction, no bias."""
    return nn.RMSNorm(shape.d_model, eps=shape.layer_norm_epsilon)


def feed_forward(shape: T5Shape, layer_index: int) -> nn.Module:
    """The MLP of block ``layer_index`` of a stack: dense, or a mixture of experts of the same kind."""
    if shape.moe is not None and shape.moe.is_moe_layer(layer_index):
        return MoELayer(shape.d_model, shape.d_ff, shape.feed_forward, shape.moe)
    return FeedForward(shape)


class EncoderBlock(nn.Module):
    """Pre-norm self-attention and MLP, each added to the residual stream after dropout."""

    def __init__(self, shape: T5Shape, layer_index: int = 0) -> None:
        super().__init__()
        self.attention_norm = _norm(shape)
        self.attention = Attention(shape)
        self.ffn_norm = _norm(shape)
        self.feed_forward = feed_forward(shape, layer_index)
        self.dropout = KeyedDropout(shape.dropout_rate, sequence_dim=SEQUENCE_DIM)

    def forward(self, x: torch.Tensor, bias: torch.Tensor, dropout_keys: torch.Tensor | None = None) -> torch.Tensor:
        x = x + self.dropout(self.attention(self.attention_norm(x), bias, dropout_keys=dropout_keys), dropout_keys,
                             SELF_ATTENTION_OUT_SITE)
        return self.mlp_residual(x, dropout_keys)

    def mlp_residual(self, x: torch.Tensor, dropout_keys: torch.Tensor | None) -> torch.Tensor:
        """x plus the MLP's dropped-out output; a dense MLP takes the keys of its hidden dropout too."""
        normed = self.ffn_norm(x)
        # The keys by keyword: sequence parallelism's PrepareModuleInput lays out the positional inputs only.
        out = self.feed_forward(normed, dropout_keys=dropout_keys) if isinstance(self.feed_forward, FeedForward) \
            else self.feed_forward(normed)
        return x + self.dropout(out, dropout_keys, FFN_OUT_SITE)


class DecoderBlock(EncoderBlock):
    """Causal self-attention, cross-attention over the encoder output, MLP (pre-norm each)."""

    def __init__(self, shape: T5Shape, layer_index: int = 0) -> None:
        super().__init__(shape, layer_index)
        self.cross_attention_norm = _norm(shape)
        self.cross_attention = Attention(shape)

    def forward(self, x: torch.Tensor, bias: torch.Tensor, memory: torch.Tensor, memory_bias: torch.Tensor | None,
                cache: dict | None = None, dropout_keys: torch.Tensor | None = None) -> torch.Tensor:
        self_cache = cross_cache = None
        if cache is not None:
            self_cache, cross_cache = cache.setdefault("self", {}), cache.setdefault("cross", {})
        keys = dropout_keys
        x = x + self.dropout(self.attention(self.attention_norm(x), bias, cache=self_cache, dropout_keys=keys), keys,
                             SELF_ATTENTION_OUT_SITE)
        # The cache by keyword: sequence parallelism's PrepareModuleInput lays out (x, memory_bias, memory).
        cross = self.cross_attention(self.cross_attention_norm(x), memory_bias, memory, cache=cross_cache,
                                     dropout_keys=keys, dropout_site=CROSS_ATTENTION_PROBS_SITE)
        x = x + self.dropout(cross, keys, CROSS_ATTENTION_OUT_SITE)
        return self.mlp_residual(x, keys)


def padding_bias(attention_mask: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """Additive key mask [batch, 1, 1, keys]: 0 for tokens, the dtype's minimum for padding (mask 0);
    None without a mask. The finite minimum (not -inf) keeps softmax finite, as Hugging Face does.
    """
    if attention_mask is None:
        return None
    return (1.0 - attention_mask[:, None, None, :].to(dtype)) * torch.finfo(dtype).min


class T5(nn.Module):
    """T5 encoder-decoder; a pipeline stage is the same class with parts set to None."""

    def __init__(self, shape: T5Shape) -> None:
        super().__init__()
        self.shape = shape
        self.shared: nn.Embedding | None = nn.Embedding(shape.vocab_size, shape.d_model)
        self.encoder_position_bias: RelativePositionBias | None = RelativePositionBias(shape, bidirectional=True)
        self.encoder_layers = nn.ModuleDict({str(i): EncoderBlock(shape, i) for i in range(shape.num_encoder_layers)})
        self.encoder_norm: nn.RMSNorm | None = _norm(shape)
        self.decoder_position_bias: RelativePositionBias | None = RelativePositionBias(shape, bidirectional=False)
        self.decoder_layers = nn.ModuleDict({str(i): DecoderBlock(shape, i) for i in range(shape.num_decoder_layers)})
        self.decoder_norm: nn.RMSNorm | None = _norm(shape)
        self.output: nn.Linear | None = nn.Linear(shape.d_model, shape.vocab_size, bias=False)
        self.dropout = KeyedDropout(shape.dropout_rate, sequence_dim=SEQUENCE_DIM)
        self.checkpoint_activations = False
        self.sequence_shards = 1
        """Set by `trainer.models.t5.parallelize.apply_t5_tp`: the tp size under sequence parallelism, where a
        pipeline stage's hidden states hold 1/sequence_shards of their sequence."""
        self.pipeline_stage = False
        """Set by `trainer.models.t5.pipeline.split_t5_stage`: forward maps stage inputs to stage outputs."""
        self.init_weights()
        self.tie_weights()

    def tie_weights(self) -> None:
        """Share the head with the token embedding (tied variants, when this module holds both)."""
        if self.shape.tie_word_embeddings and self.shared is not None and self.output is not None:
            self.output.weight = self.shared.weight

    def init_weights(self) -> None:
        """`init_parameter` of every parameter, in `named_parameters` order."""
        for name, param in self.named_parameters():
            self.init_parameter(name, param)

    @torch.no_grad()
    def init_parameter(self, name: str, tensor: torch.Tensor) -> None:
        """Hugging Face's T5 init of parameter ``name`` into ``tensor`` (the parameter, or a full-size
        stand-in for a sharded one): N(0, factor x fan-in**-0.5) per linear (q: (d_model d_kv)**-0.5),
        N(0, factor) for the embedding and an untied head, norms at factor."""
        s, factor = self.shape, self.shape.initializer_factor
        if "norm" in name:
            tensor.fill_(factor)
            return
        std = {"wq": (s.d_model * s.d_kv) ** -0.5, "wk": s.d_model ** -0.5, "wv": s.d_model ** -0.5,
               "wo": (s.num_heads * s.d_kv) ** -0.5, "w1": s.d_model ** -0.5, "w3": s.d_model ** -0.5,
               "w2": s.d_ff ** -0.5, "embedding": s.d_model ** -0.5, "shared": 1.0, "output": 1.0,
               "router": s.d_model ** -0.5}
        tensor.normal_(0.0, factor * std[name.split(".")[-2]])

    def encoder_bias(self, length: int, key_bias: torch.Tensor | None, dtype: torch.dtype,
                     rows: torch.Tensor | None = None) -> torch.Tensor:
        """Position bias plus padding mask of the encoder's self-attention [1 or batch, heads, Le, Le].

        Args:
            key_bias: `padding_bias` of the encoder's attention mask, or None (no padding).
            rows: the encoder table's rows (`RelativePositionBias.rows`); default this module's table.
        """
        rows = self.encoder_position_bias.rows() if rows is None else rows
        bias = position_bias(rows, True, self.shape.relative_attention_max_distance, length, length).to(dtype)
        return bias if key_bias is None else bias + key_bias

    def decoder_bias(self, length: int, offset: int, dtype: torch.dtype, rows: torch.Tensor | None = None) -> torch.Tensor:
        """Position bias plus causal mask of ``length`` decoder queries after ``offset`` earlier positions
        (``rows``: the decoder table's rows; default this module's table)."""
        rows = self.decoder_position_bias.rows() if rows is None else rows
        bias = position_bias(rows, False, self.shape.relative_attention_max_distance, length, offset + length,
                             offset).to(dtype)
        if length == 1:
            return bias  # the newest query may see every key
        causal = torch.ones(length, offset + length, dtype=torch.bool, device=bias.device).tril(offset)
        return bias.masked_fill(~causal, torch.finfo(dtype).min)

    def outer_dropout(self, x: torch.Tensor, dropout_keys: torch.Tensor | None, site: int) -> torch.Tensor:
        """The dropout of the embeddings and stack outputs (keyed outside the blocks)."""
        return self.dropout(x, layer_keys(dropout_keys, OUTSIDE_LAYERS), site)

    def run_encoder_layers(self, h: torch.Tensor, bias: torch.Tensor,
                           dropout_keys: torch.Tensor | None = None) -> torch.Tensor:
        # A recomputed layer sees the same keys, so it draws the same masks.
        calls = [functools.partial(layer, bias=bias, dropout_keys=layer_keys(dropout_keys, int(name)))
                 for name, layer in self.encoder_layers.items()]
        return run_layers(calls, h, self.checkpoint_activations)

    def run_decoder_layers(self, h: torch.Tensor, bias: torch.Tensor, memory: torch.Tensor,
                           memory_bias: torch.Tensor | None, cache: dict | None = None,
                           dropout_keys: torch.Tensor | None = None) -> torch.Tensor:
        if cache is not None:
            for name, layer in self.decoder_layers.items():
                h = layer(h, bias, memory, memory_bias, cache.setdefault(name, {}))
            return h
        # Decoder layers follow the encoder's in the global layer order (as the pipeline splits them).
        calls = [functools.partial(layer, bias=bias, memory=memory, memory_bias=memory_bias,
                                   dropout_keys=layer_keys(dropout_keys, self.shape.num_encoder_layers + int(name)))
                 for name, layer in self.decoder_layers.items()]
        return run_layers(calls, h, self.checkpoint_activations)

    def head(self, h: torch.Tensor, dropout_keys: torch.Tensor | None = None) -> torch.Tensor:
        """Final decoder norm, the v1.0 output scaling, and the LM head: logits [batch, Ld, vocab]."""
        h = self.outer_dropout(self.decoder_norm(h), dropout_keys, DECODER_OUTPUT_SITE)
        if self.shape.scale_decoder_outputs:
            h = h * self.shape.d_model ** -0.5
        return self.output(h)

    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
               dropout_keys: torch.Tensor | None = None) -> torch.Tensor:
        """Encoder output [batch, Le, d_model] of token ids [batch, Le] (mask: 1 token, 0 padding)."""
        h = self.outer_dropout(self.shared(input_ids), dropout_keys, ENCODER_EMBEDDING_SITE)
        bias = self.encoder_bias(input_ids.shape[1], padding_bias(attention_mask, h.dtype), h.dtype)
        h = self.run_encoder_layers(h, bias, dropout_keys)
        return self.outer_dropout(self.encoder_norm(h), dropout_keys, ENCODER_OUTPUT_SITE)

    def decode(self, decoder_input_ids: torch.Tensor, memory: torch.Tensor,
               encoder_attention_mask: torch.Tensor | None = None, cache: dict | None = None,
               dropout_keys: torch.Tensor | None = None) -> torch.Tensor:
        """Logits [batch, Ld, vocab] of decoder ids [batch, Ld] attending to the encoder output ``memory``.

        ``cache`` (generation only): a dict filled across calls; each call then passes only the new
        decoder ids, which continue the ones passed before.
        """
        h = self.outer_dropout(self.shared(decoder_input_ids), dropout_keys, DECODER_EMBEDDING_SITE)
        length = decoder_input_ids.shape[1]
        offset = cache.get("length", 0) if cache is not None else 0
        bias = self.decoder_bias(length, offset, h.dtype)
        h = self.run_decoder_layers(h, bias, memory, padding_bias(encoder_attention_mask, h.dtype), cache,
                                    dropout_keys)
        if cache is not None:
            cache["length"] = offset + length
        return self.head(h, dropout_keys)

    def forward(self, *inputs: torch.Tensor,
                dropout_keys: torch.Tensor | None = None) -> torch.Tensor | tuple[torch.Tensor, ...]:
        """The whole model: (encoder_input_ids, decoder_input_ids[, encoder_attention_mask]) -> logits;
        ``dropout_keys`` (training with keyed dropout): int64 [batch] `trainer.parallel.keyed_dropout.sample_keys`.

        Args:
            encoder_input_ids: int64 [batch, Le].
            decoder_input_ids: int64 [batch, Ld] (targets shifted right behind the start id).
            encoder_attention_mask: int [batch, Le], 1 for tokens, 0 for padding; absent: no padding.

        Returns:
            Logits [batch, Ld, vocab]. A pipeline stage (see `pipeline_stage_forward`) instead maps
            the previous stage's tensors to the next stage's.
        """
        if self.pipeline_stage:
            return self.pipeline_stage_forward(*inputs, dropout_keys=dropout_keys)
        encoder_input_ids, decoder_input_ids, *mask = inputs
        mask = mask[0] if mask else None
        memory = self.encode(encoder_input_ids, mask, dropout_keys)
        return self.decode(decoder_input_ids, memory, mask, dropout_keys=dropout_keys)

    def pipeline_stage_forward(self, *inputs: torch.Tensor,
                               dropout_keys: torch.Tensor | None = None) -> torch.Tensor | tuple[torch.Tensor, ...]:
        """One pipeline stage: the parts this module holds, between the tensors stages exchange.

        The first stage takes (encoder_input_ids, decoder_input_ids, encoder_attention_mask) and
        embeds both id sequences (the embedding then lives on one stage only). Stages send
        encoder stages: (encoder hidden, decoder embeddings, encoder table rows, memory bias), the stage
        holding the last encoder layer the same without the table rows (no later stage reads them: a received
        tensor that gets no gradient is an error to torch 2.11's schedules);
        decoder stages: (decoder hidden, encoder output, decoder table rows, memory bias);
        the last stage returns logits. The stage holding the first decoder layer finishes the
        encoder (its final norm). Each position-bias table lives on one stage; what travels is its rows
        ([buckets, heads], `RelativePositionBias.rows`, their gradient coming back through the schedule),
        not the [batch, heads, L, L] bias: a stage keeps a receive buffer and an input gradient per
        micro-batch, and at L = 1024 a bias is tens of megabytes where the rows are a few hundred numbers.
        The memory bias ([batch, 1, 1, Le], the padding mask) is the encoder's key bias as well.
        """
        if self.shared is not None:
            encoder_ids, decoder_ids, mask = inputs
            h = self.outer_dropout(self.shared(encoder_ids), dropout_keys, ENCODER_EMBEDDING_SITE)
            decoder_h = self.outer_dropout(self.shared(decoder_ids), dropout_keys, DECODER_EMBEDDING_SITE)
            encoder_rows = self.encoder_position_bias.rows()
            memory_bias = padding_bias(mask, h.dtype)
        elif self.encoder_layers:
            h, decoder_h, encoder_rows, memory_bias = inputs
        elif self.decoder_position_bias is not None:
            h, decoder_h, memory_bias = inputs
        else:
            decoder_h, memory, decoder_rows, memory_bias = inputs
        if self.encoder_layers:
            bias = self.encoder_bias(h.shape[1] * self.sequence_shards, memory_bias, h.dtype, encoder_rows)
            h = self.run_encoder_layers(h, bias, dropout_keys)
        if self.decoder_position_bias is not None:
            memory = self.outer_dropout(self.encoder_norm(h), dropout_keys, ENCODER_OUTPUT_SITE)
            decoder_rows = self.decoder_position_bias.rows()
        elif self.encoder_layers or self.shared is not None:
            # The decoder embeddings only pass through encoder stages (`settled`).
            if str(self.shape.num_encoder_layers - 1) in self.encoder_layers:
                return h, settled(decoder_h), memory_bias
            return h, settled(decoder_h), encoder_rows, memory_bias
        decoder_length = decoder_h.shape[1] * self.sequence_shards
        decoder_bias = self.decoder_bias(decoder_length, 0, decoder_h.dtype, decoder_rows)
        decoder_h = self.run_decoder_layers(decoder_h, decoder_bias, memory, memory_bias, dropout_keys=dropout_keys)
        if self.output is not None:
            return self.head(decoder_h, dropout_keys)
        return decoder_h, memory, decoder_rows, memory_bias
