"""Context parallelism (Megatron's ``--context-parallel-size``): each sequence split over the ranks of a cp
group, attention over the whole sequence by all-gathering keys and values (the Llama 3 paper's approach).

Megatron's load-balanced layout: a sequence of ``seq_len`` tokens is cut into ``2 * cp`` equal chunks and
cp rank ``r`` keeps chunks ``r`` and ``2 * cp - 1 - r`` (megatron-core's ``get_batch_on_this_cp_rank``), so
under causal attention every rank has the same work: one early chunk that sees few keys, one late chunk
that sees many. Each rank computes its own tokens everywhere except in attention, where its queries attend
the keys and values of all ranks (`gather_sequence`: an all-gather whose backward reduce-scatters the
gradients back to the tokens' owners) under the causal mask of the tokens' true positions
(`ContextParallel.attention`: in blocks of queries, each against the keys up to its end under a slice of one
`block_causal_mask`, keeping no gathered keys for the backward: a rank's activation memory falls with the share
of the sequence it holds). The loss is the mean over the tokens of the whole sequence (`context_parallel_loss`).

    layout = ContextLayout(size=2, rank=1)
    layout.local_indices(8)    # tensor([2, 3, 4, 5]): chunks 1 and 2 of [0,1][2,3][4,5][6,7]
    layout.shard(tokens)       # tokens[:, [2, 3, 4, 5]]

Modules that declare a ``context_parallel`` attribute (None without cp) receive the run's `ContextParallel`
from `apply_cp`; nothing here knows a model family.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.checkpoint import checkpoint

from trainer.parallel.token_loss import loss_token_count, weighted_token_loss

# Megatron's layout cuts each sequence into this many chunks per cp rank (one early, one late).
CHUNKS_PER_RANK = 2
# The attribute a module declares (set to None) to receive the run's `ContextParallel`.
CONTEXT_PARALLEL_ATTRIBUTE = "context_parallel"
# Local queries per attention call (`ContextParallel.attention`): the additive mask a rank builds is this many
# rows by the whole sequence, whatever the sequence's length (128 x 16,384 float32: 8 MiB).
QUERY_BLOCK = 128
# An attention call on one block: (queries, keys, values, additive mask) -> output of the queries' shape.
Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True, slots=True)
class ContextLayout:
    """Which tokens of a sequence cp rank ``rank`` of ``size`` holds (Megatron's load-balanced layout)."""

    size: int
    rank: int

    def local_indices(self, seq_len: int, device: torch.device | None = None) -> torch.Tensor:
        """int64 [seq_len / size]: the sequence positions this rank keeps, chunk ``rank`` then chunk
        ``2 * size - 1 - rank``, each in order.

        Raises:
            ValueError: ``seq_len`` is not divisible by ``2 * size``.
        """
        return _indices_of_rank(seq_len, self.size, self.rank, device)

    def chunk_starts(self, seq_len: int) -> tuple[int, int]:
        """The sequence positions where this rank's two chunks (``seq_len / (2 * size)`` tokens each) start."""
        return _chunk_starts(seq_len, self.size, self.rank)

    def gathered_indices(self, local_len: int, device: torch.device | None = None) -> torch.Tensor:
        """int64 [size * local_len]: the sequence positions of an all-gather of every rank's ``local_len``
        tokens, in the gather's order (rank 0's tokens, then rank 1's, ...)."""
        seq_len = local_len * self.size
        return torch.cat([_indices_of_rank(seq_len, self.size, r, device) for r in range(self.size)])

    def shard(self, tensor: torch.Tensor, dim: int = 1) -> torch.Tensor:
        """This rank's tokens of ``tensor`` (the whole sequence along ``dim``; any dtype and other dims)."""
        return tensor.index_select(dim, self.local_indices(tensor.shape[dim], tensor.device))


def _chunk_starts(seq_len: int, size: int, rank: int) -> tuple[int, int]:
    num_chunks = CHUNKS_PER_RANK * size
    if seq_len % num_chunks:
        raise ValueError(f"sequence length {seq_len} is not divisible by 2 x context-parallel size ({size})")
    chunk = seq_len // num_chunks
    return rank * chunk, (num_chunks - 1 - rank) * chunk


def _indices_of_rank(seq_len: int, size: int, rank: int, device: torch.device | None) -> torch.Tensor:
    chunk = seq_len // (CHUNKS_PER_RANK * size)
    return torch.cat([torch.arange(start, start + chunk, device=device)
                      for start in _chunk_starts(seq_len, size, rank)])


def block_causal_mask(rows: int, seq_len: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Additive mask [rows, seq_len] of ``dtype`` (0 visible, -inf masked) that every block of queries slices.

    Its last ``rows`` columns are causal (column j masked in the rows above j), the columns before visible.
    A block of b <= rows queries at positions p..p+b-1 against the keys at positions 0..p+b-1 takes the view
    ``[rows - b:, seq_len - (p + b):]``: the keys before p visible, the last b causal. One tensor for all blocks
    (a view is no copy: the attention kernels read it with its strides).
    """
    mask = torch.zeros(rows, seq_len, dtype=dtype, device=device)
    mask[:, seq_len - rows:] = torch.full((rows, rows), float("-inf"), dtype=dtype, device=device).triu(1)
    return mask


class _GatherSequence(torch.autograd.Function):
    """All-gather along ``dim`` over ``group``; backward: the summed gradients of this rank's slice
    (a reduce-scatter), since every rank's queries used every rank's keys."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: dist.ProcessGroup, dim: int) -> torch.Tensor:
        ctx.group, ctx.dim = group, dim
        size = dist.get_world_size(group)
        local = x.movedim(dim, 0).contiguous()
        out = local.new_empty((size * local.shape[0], *local.shape[1:]))
        if dist.get_backend(group) == dist.Backend.GLOO:
            # gloo's all-gather copies through a full-size staging buffer of its own that its worker thread frees,
            # where the profiler's allocation record never sees it go (each gather would read as held to the end
            # of the step). An all-to-all of the local slice repeated moves the same bytes, at the same peak,
            # through buffers the caller allocates.
            dist.all_to_all_single(out, local.repeat(size, *[1] * (local.dim() - 1)), group=group)
        else:
            dist.all_gather_single(out, local, group=group)
        return out.movedim(0, dim)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        size = dist.get_world_size(ctx.group)
        full = grad.movedim(ctx.dim, 0).contiguous()
        local = full.new_empty((full.shape[0] // size, *full.shape[1:]))
        dist.reduce_scatter_single(local, full, group=ctx.group)
        return local.movedim(0, ctx.dim), None, None


def gather_sequence(x: torch.Tensor, group: dist.ProcessGroup, dim: int) -> torch.Tensor:
    """Every cp rank's ``x`` concatenated along ``dim`` in rank order (autograd-aware: gradients flow back to
    the rank that owns each slice, summed over the ranks that used it)."""
    return _GatherSequence.apply(x, group, dim)


class ContextParallel:
    """A run's cp group as the attention sees it: gather keys/values, the mask of the local queries."""

    def __init__(self, group: dist.ProcessGroup) -> None:
        self.group = group
        self.layout = ContextLayout(size=dist.get_world_size(group), rank=dist.get_rank(group))

    def gather_kv(self, k: torch.Tensor, v: torch.Tensor, seq_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of the whole sequence from this rank's ([..., local seq, ...] each, seq along
        ``seq_dim``), in `ContextLayout.gathered_indices` order; one collective for both. Key/value groups
        (grouped-query attention) are gathered as they are, before any repeat over query heads."""
        both = gather_sequence(torch.stack((k, v)), self.group, seq_dim + 1)
        return both[0], both[1]

    def attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, heads_per_group: int,
                  attend: Attend) -> torch.Tensor:
        """Causal attention of this rank's queries over the whole sequence's keys and values.

        Args:
            q: [batch, heads, local seq, head_dim], this rank's queries (after rope, at their true positions).
            k, v: [batch, groups, local seq, head_dim], this rank's keys and values; each group serves
                ``heads_per_group`` consecutive query heads.
            attend: the attention of one block (`Attend`); it gets keys and values repeated over the heads.

        Returns:
            [batch, heads, local seq, head_dim].

        When gradients are recorded the call is recomputed in the backward (as Transformer Engine's all-gather
        attention gathers again there): what it keeps is this rank's q, k and v, not the gathered keys and
        values, nor a block's mask. Each chunk's queries go in blocks of `QUERY_BLOCK`, each against the keys up
        to its last position: no keys after a block are computed with, and no mask is larger than
        `QUERY_BLOCK` x sequence.
        """
        if torch.is_grad_enabled():
            return checkpoint(self._attention, q, k, v, heads_per_group, attend, use_reentrant=False)
        return self._attention(q, k, v, heads_per_group, attend)

    def _attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, heads_per_group: int,
                   attend: Attend) -> torch.Tensor:
        local_len = q.shape[2]
        seq_len = local_len * self.layout.size
        # The gather's order (rank 0's chunks, rank 1's, ...) into the sequence's: each block's keys are a prefix.
        order = torch.argsort(self.layout.gathered_indices(local_len, q.device))
        k, v = (t.index_select(2, order) for t in self.gather_kv(k, v, seq_dim=2))
        if heads_per_group > 1:
            k, v = (t.repeat_interleave(heads_per_group, dim=1) for t in (k, v))
        chunk = local_len // CHUNKS_PER_RANK
        rows = min(QUERY_BLOCK, chunk)
        mask = block_causal_mask(rows, seq_len, q.dtype, q.device)
        outputs = []
        for index, start in enumerate(self.layout.chunk_starts(seq_len)):
            for offset in range(0, chunk, rows):
                block = min(rows, chunk - offset)
                first = index * chunk + offset
                keys = start + offset + block
                outputs.append(attend(q[:, :, first:first + block], k[:, :, :keys], v[:, :, :keys],
                                      mask[rows - block:, seq_len - keys:]))
        return torch.cat(outputs, dim=2)

    def local_positions(self, local_len: int, device: torch.device) -> torch.Tensor:
        """int64 [local_len]: the true positions of this rank's tokens of a 0..seq-1 sequence."""
        return self.layout.local_indices(local_len * self.layout.size, device)


def apply_cp(module: nn.Module, group: dist.ProcessGroup) -> None:
    """Give every submodule of ``module`` that declares ``context_parallel`` the run's `ContextParallel`."""
    context = ContextParallel(group)
    for child in module.modules():
        if hasattr(child, CONTEXT_PARALLEL_ATTRIBUTE):
            setattr(child, CONTEXT_PARALLEL_ATTRIBUTE, context)


def context_parallel_loss(loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], outputs: torch.Tensor,
                          targets: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """This rank's share of the sequence-mean loss, scaled for gradients averaged over dp x cp.

    The mean over all tokens of the sequence is sum_r s_r / T (s_r: rank r's loss sum, T: the tokens with a
    target on all cp ranks). Each rank returns ``size * s_r / T`` (`weighted_token_loss` with T / size tokens per
    loss): averaging the gradients over the cp ranks (with the data-parallel ones) then gives the gradient of the
    mean, and so does averaging the returned losses for the report.

    Args:
        loss_fn: (outputs, targets) -> the mean loss over the tokens with a target (a scalar).
        outputs: this rank's model outputs for its tokens.
        targets: int64 [batch, local seq], IGNORE_INDEX where no loss is taken.
        group: the cp group (collective: one all-reduce of a count).
    """
    total = loss_token_count(targets)
    dist.all_reduce(total, group=group)
    return weighted_token_loss(loss_fn, outputs, targets, total / dist.get_world_size(group))
