"""BERT for pre-training: post-LayerNorm blocks, GELU MLP, token-type embeddings, a pooler, an MLM head tied
to the word embedding and a binary (sentence-order) head.

    model = Bert(BertShape(num_layers=2, hidden_size=32, num_attention_heads=4, ffn_hidden_size=64,
                           max_position_embeddings=64, padded_vocab_size=1024))
    mlm_logits, binary_logits = model(tokens, token_types, padding_mask)   # [b, s, V], [b, 2]

Written to be split and sharded by PyTorch's own tools, as `trainer.models.gpt.model`:

- blocks live in a ``ModuleDict`` keyed by their global index, so a parameter has the same name in
  every tensor/pipeline layout and checkpoints reshard;
- the embeddings (first pipeline stage) and the pooler, binary head and MLM head (last stage) may be
  None in a stage that does not own them; a stage passes (hidden states, attention bias) on
  (`Bert.forward`);
- attention infers the local head count from the shape, so column-parallel q/k/v keep whole heads
  on each tensor-parallel rank.

Names map one-to-one onto Hugging Face ``BertForPreTraining`` (`trainer.models.bert.hf`): the
embeddings and their LayerNorm, per block q/k/v/o with the post-attention LayerNorm and the MLP with
its LayerNorm, ``bert.pooler.dense``, ``cls.predictions.transform`` (``lm_head.dense``/``lm_head.norm``),
the decoder (``lm_head.decoder``, its weight the word embedding, its bias ``cls.predictions.bias``) and
``cls.seq_relationship`` (``binary_head``).

The same class with ``BertShape(head=SPAN_HEAD)`` is ``BertForQuestionAnswering``: no pooler, MLM or binary
head, but a span head (``qa_outputs``: hidden -> start and end logits per position).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from trainer.parallel.recompute import RECOMPUTE_CORE_ATTENTION, core_attention, run_layers

# The word embedding, and the MLM decoder tied to it (under pipelining the last stage's own copy).
TIED_WEIGHT_NAME = "word_embeddings.weight"
TIED_COPY_NAME = "lm_head.decoder.weight"
# Parameters whose rows are the padded vocabulary.
VOCAB_ROWS = (TIED_WEIGHT_NAME, TIED_COPY_NAME, "lm_head.decoder.bias")
# Segment A and segment B of a sentence pair.
NUM_TOKEN_TYPES = 2
# The binary head's classes (sentence order kept / swapped; HF: next sentence / random).
NUM_BINARY_CLASSES = 2
# The model's heads: masked LM (+ sentence order) for pre-training, or start/end logits for extractive QA.
PRETRAINING_HEAD = "pretraining"
SPAN_HEAD = "span"
HEADS = (PRETRAINING_HEAD, SPAN_HEAD)
# The span head's outputs per position: start and end logits.
NUM_SPAN_LOGITS = 2
# Residual output projections, initialised with std / sqrt(2 L) (Megatron's scaled init).
RESIDUAL_OUTPUTS = ("attention.wo.weight", "feed_forward.w2.weight")


@dataclass(frozen=True, slots=True)
class BertShape:
    """Resolved model dimensions (vocabulary already padded)."""

    num_layers: int
    hidden_size: int
    num_attention_heads: int
    ffn_hidden_size: int
    max_position_embeddings: int
    padded_vocab_size: int
    binary_head: bool = True
    """Whether the model has the pooler and the sentence-order head (``--bert-binary-head``)."""
    hidden_dropout: float = 0.0
    attention_dropout: float = 0.0
    init_method_std: float = 0.02
    layernorm_epsilon: float = 1e-12
    """BERT's LayerNorm epsilon (Hugging Face ``layer_norm_eps``)."""
    head: str = PRETRAINING_HEAD
    """`PRETRAINING_HEAD` (MLM, and the binary head when ``binary_head``) or `SPAN_HEAD` (extractive QA)."""

    def __post_init__(self) -> None:
        if self.head not in HEADS:
            raise ValueError(f"head must be one of {', '.join(HEADS)}, got {self.head!r}")

    @property
    def has_pooler(self) -> bool:
        """Whether the model has the pooler and the binary head (pre-training with ``binary_head``)."""
        return self.head == PRETRAINING_HEAD and self.binary_head


def attention_bias(padding_mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Additive attention bias [batch, 1, 1, seq] of a padding mask (int [batch, seq], 1 token, 0 padding):
    0 where a key may be attended, the dtype's lowest value where it is padding (Hugging Face's choice,
    so that imported models give its logits)."""
    return ((1 - padding_mask[:, None, None, :].to(dtype)) * torch.finfo(dtype).min).contiguous()


class Attention(nn.Module):
    """Bidirectional multi-head self-attention."""

    def __init__(self, shape: BertShape) -> None:
        super().__init__()
        h = shape.hidden_size
        self.head_dim = h // shape.num_attention_heads
        self.wq = nn.Linear(h, h)
        self.wk = nn.Linear(h, h)
        self.wv = nn.Linear(h, h)
        self.wo = nn.Linear(h, h)
        self.attention_dropout = shape.attention_dropout
        setattr(self, RECOMPUTE_CORE_ATTENTION, False)

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        """x: [batch, seq, hidden], bias [batch, 1, 1, seq] -> [batch, seq, hidden]."""
        batch, seq, _ = x.shape
        # -1 heads: under tensor parallelism each rank holds hidden/tp columns = heads/tp whole heads.
        q, k, v = (w(x).view(batch, seq, -1, self.head_dim).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        dropout = self.attention_dropout if self.training else 0.0
        out = core_attention(self, F.scaled_dot_product_attention, q, k, v, attn_mask=bias.to(q.dtype),
                             dropout_p=dropout)
        return self.wo(out.transpose(1, 2).reshape(batch, seq, -1))


class FeedForward(nn.Module):
    """GELU MLP (the exact erf GELU, as BERT)."""

    def __init__(self, shape: BertShape) -> None:
        super().__init__()
        self.w1 = nn.Linear(shape.hidden_size, shape.ffn_hidden_size)
        self.w2 = nn.Linear(shape.ffn_hidden_size, shape.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.gelu(self.w1(x)))


class Block(nn.Module):
    """Post-LayerNorm transformer block: x = LN(x + attention(x)); x = LN(x + MLP(x))."""

    def __init__(self, shape: BertShape) -> None:
        super().__init__()
        self.attention = Attention(shape)
        self.attention_norm = nn.LayerNorm(shape.hidden_size, eps=shape.layernorm_epsilon)
        self.feed_forward = FeedForward(shape)
        self.ffn_norm = nn.LayerNorm(shape.hidden_size, eps=shape.layernorm_epsilon)
        self.dropout = nn.Dropout(shape.hidden_dropout)

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        x = self.attention_norm(x + self.dropout(self.attention(x, bias)))
        return self.ffn_norm(x + self.dropout(self.feed_forward(x)))


class LMHead(nn.Module):
    """The MLM head: dense + GELU + LayerNorm, then the decoder (weight tied to the word embedding, own bias)."""

    def __init__(self, shape: BertShape) -> None:
        super().__init__()
        self.dense = nn.Linear(shape.hidden_size, shape.hidden_size)
        self.norm = nn.LayerNorm(shape.hidden_size, eps=shape.layernorm_epsilon)
        self.decoder = nn.Linear(shape.hidden_size, shape.padded_vocab_size)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.norm(F.gelu(self.dense(h))))


class Bert(nn.Module):
    """BERT for pre-training; a pipeline stage is the same class with some parts set to None."""

    def __init__(self, shape: BertShape) -> None:
        super().__init__()
        self.shape = shape
        h = shape.hidden_size
        self.word_embeddings: nn.Embedding | None = nn.Embedding(shape.padded_vocab_size, h)
        self.position_embeddings: nn.Embedding | None = nn.Embedding(shape.max_position_embeddings, h)
        self.token_type_embeddings: nn.Embedding | None = nn.Embedding(NUM_TOKEN_TYPES, h)
        self.embedding_norm: nn.LayerNorm | None = nn.LayerNorm(h, eps=shape.layernorm_epsilon)
        self.embedding_dropout: nn.Dropout | None = nn.Dropout(shape.hidden_dropout)
        self.layers = nn.ModuleDict({str(i): Block(shape) for i in range(shape.num_layers)})
        self.pooler: nn.Linear | None = nn.Linear(h, h) if shape.has_pooler else None
        self.binary_head: nn.Linear | None = nn.Linear(h, NUM_BINARY_CLASSES) if shape.has_pooler else None
        self.lm_head: LMHead | None = LMHead(shape) if shape.head == PRETRAINING_HEAD else None
        self.qa_outputs: nn.Linear | None = nn.Linear(h, NUM_SPAN_LOGITS) if shape.head == SPAN_HEAD else None
        self.checkpoint_activations = False
        self.init_weights()
        self.tie_weights()

    def tie_weights(self) -> None:
        """Share the MLM decoder's weight with the word embedding (when this module holds both)."""
        if self.word_embeddings is not None and self.lm_head is not None:
            self.lm_head.decoder.weight = self.word_embeddings.weight

    def init_weights(self) -> None:
        """`init_parameter` of every parameter, in `named_parameters` order."""
        for name, param in self.named_parameters():
            self.init_parameter(name, param)

    @torch.no_grad()
    def init_parameter(self, name: str, tensor: torch.Tensor) -> None:
        """Megatron's BERT init of parameter ``name`` into ``tensor`` (the parameter, or a full-size stand-in
        for a sharded one): N(0, std), std/sqrt(2 L) for the residual output projections, LayerNorms at 1,
        biases at 0."""
        std = self.shape.init_method_std
        if name.endswith("norm.weight"):
            tensor.fill_(1.0)
        elif name.endswith(".bias"):
            tensor.zero_()
        elif name.endswith(RESIDUAL_OUTPUTS):
            tensor.normal_(0.0, std / math.sqrt(2.0 * self.shape.num_layers))
        else:
            tensor.normal_(0.0, std)

    def embed(self, tokens: torch.Tensor, token_types: torch.Tensor) -> torch.Tensor:
        """Hidden states [batch, seq, hidden] of token ids and token types (int64 [batch, seq])."""
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        h = self.word_embeddings(tokens) + self.position_embeddings(positions)[None] \
            + self.token_type_embeddings(token_types)
        return self.embedding_dropout(self.embedding_norm(h))

    def run_layers(self, h: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        calls = [functools.partial(layer, bias=bias) for layer in self.layers.values()]
        return run_layers(calls, h, self.checkpoint_activations)

    def drop_heads(self) -> None:
        """Remove every head (a pipeline stage before the last)."""
        self.pooler = self.binary_head = self.lm_head = self.qa_outputs = None

    def has_heads(self) -> bool:
        """Whether this module (or pipeline stage) computes the outputs rather than passing hidden states on."""
        return self.lm_head is not None or self.qa_outputs is not None

    def encode(self, tokens: torch.Tensor, token_types: torch.Tensor, padding_mask: torch.Tensor) -> torch.Tensor:
        """The last hidden states [batch, seq, hidden] of a whole model (Hugging Face ``BertModel``'s
        ``last_hidden_state``)."""
        h = self.embed(tokens, token_types)
        return self.run_layers(h, attention_bias(padding_mask, h.dtype))

    def heads(self, h: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """MLM logits [batch, seq, padded_vocab] and, with the binary head, its logits [batch, 2] from the
        pooled first ([CLS]) position; with the span head, start and end logits, each float [batch, seq]."""
        if self.qa_outputs is not None:
            start, end = self.qa_outputs(h).unbind(dim=-1)
            return start.contiguous(), end.contiguous()
        mlm = self.lm_head(h)
        if self.binary_head is None:
            return (mlm,)
        pooled = torch.tanh(self.pooler(h[:, 0]))
        return mlm, self.binary_head(pooled)

    def forward(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The model, or one pipeline stage of it.

        Args:
            inputs: on the first stage (tokens, token_types, padding_mask), each int64 [batch, seq]
                (padding_mask 1 for tokens, 0 for padding); on a later stage the previous stage's
                (hidden [batch, seq, hidden], attention bias [batch, 1, 1, seq]).

        Returns:
            The last stage: (MLM logits [batch, seq, padded_vocab], binary logits [batch, 2]), the
            latter absent without the binary head; with the span head (start logits, end logits), each
            [batch, seq]. Other stages: (hidden, attention bias).
        """
        if self.word_embeddings is not None:
            tokens, token_types, padding_mask = inputs
            h = self.embed(tokens, token_types)
            bias = attention_bias(padding_mask, h.dtype)
        else:
            h, bias = inputs
        h = self.run_layers(h, bias)
        if not self.has_heads():
            return h, bias
        return self.heads(h)
