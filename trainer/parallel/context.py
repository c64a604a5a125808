"""Context parallelism (Megatron's ``--context-parallel-size``): each sequence split over the ranks of a cp
group, attention over the whole sequence by all-gathering keys and values (the Llama 3 paper's approach).

Megatron's load-balanced layout: a sequence of ``seq_len`` tokens is cut into ``2 * cp`` equal chunks and
cp rank ``r`` keeps chunks ``r`` and ``2 * cp - 1 - r`` (megatron-core's ``get_batch_on_this_cp_rank``), so
under causal attention every rank has the same work: one early chunk that sees few keys, one late chunk
that sees many. Each rank computes its own tokens everywhere except in attention, where its queries attend
the keys and values of all ranks (`ContextParallel.whole_sequence`: an all-gather; the gradients go back to
the tokens' owners by a reduce-scatter, `ContextParallel.to_owners`) under the causal mask of the tokens' true
positions (`ContextParallel.attention`: in blocks of queries, each against the keys up to its end under a slice
of one `block_causal_mask`, keeping no gathered keys for the backward: a rank's activation memory falls with the
share of the sequence it holds). The loss is the mean over the tokens of the whole sequence (`context_parallel_loss`).

    layout = ContextLayout(size=2, rank=1)
    layout.local_indices(8)    # tensor([2, 3, 4, 5]): chunks 1 and 2 of [0,1][2,3][4,5][6,7]
    layout.shard(tokens)       # tokens[:, [2, 3, 4, 5]]

Modules that declare a ``context_parallel`` attribute (None without cp) receive the run's `ContextParallel`
from `apply_cp`; nothing here knows a model family.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.profiler import record_function

from trainer.parallel.token_loss import loss_token_count, weighted_token_loss

# Megatron's layout cuts each sequence into this many chunks per cp rank (one early, one late).
CHUNKS_PER_RANK = 2
# The attribute a module declares (set to None) to receive the run's `ContextParallel`.
CONTEXT_PARALLEL_ATTRIBUTE = "context_parallel"
# Local queries per attention call (`ContextParallel.attention`): the additive mask a rank builds is this many
# rows by the whole sequence, whatever the sequence's length (128 x 16,384 float32: 8 MiB).
QUERY_BLOCK = 128
# The profiler's names of the K/V gather and of its gradients' reduce-scatter (a collective and its wait each).
GATHER_EVENT, REDUCE_SCATTER_EVENT = "context_parallel_gather", "context_parallel_reduce_scatter"
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


# The single-tensor collectives: torch 2.13 names them ``*_single`` (the older names warn); earlier releases of the
# declared torch range have only the older names.
_ALL_GATHER_TENSOR = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_REDUCE_SCATTER_TENSOR = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def _all_gather_into(out: torch.Tensor, local: torch.Tensor, group: dist.ProcessGroup) -> None:
    """Every rank's ``local`` (contiguous) into ``out``, concatenated along dim 0 in rank order (no autograd)."""
    size, rank, length = dist.get_world_size(group), dist.get_rank(group), local.shape[0]
    with record_function(GATHER_EVENT):
        if dist.get_backend(group) == dist.Backend.GLOO:
            # In place, one broadcast per rank into the output's slices: gloo's all-gather stages through a
            # full-size buffer of its own.
            out[rank * length:(rank + 1) * length].copy_(local)
            for source in range(size):
                dist.broadcast(out[source * length:(source + 1) * length], group_src=source, group=group)
        else:
            _ALL_GATHER_TENSOR(out, local, group=group)


def _reduce_scatter(full: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """This rank's slice along dim 0 of ``full`` (contiguous; gloo uses it as scratch) summed over the ranks
    (`_all_gather_into`'s adjoint; no autograd)."""
    size, rank = dist.get_world_size(group), dist.get_rank(group)
    length = full.shape[0] // size
    with record_function(REDUCE_SCATTER_EVENT):
        if dist.get_backend(group) == dist.Backend.GLOO:
            # In place, one reduce per rank onto its slice: gloo's reduce-scatter clones its input.
            for destination in range(size):
                dist.reduce(full[destination * length:(destination + 1) * length], group_dst=destination,
                            group=group)
            return full[rank * length:(rank + 1) * length].clone()
        local = full.new_empty((length, *full.shape[1:]))
        _REDUCE_SCATTER_TENSOR(local, full, group=group)
    return local


def _rng_states(device: torch.device) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The CPU generator's state and ``device``'s (None on the CPU): what attention dropout draws from."""
    return torch.get_rng_state(), torch.cuda.get_rng_state(device) if device.type == "cuda" else None


@contextlib.contextmanager
def _replayed_rng(states: tuple[torch.Tensor, torch.Tensor | None], device: torch.device) -> Iterator[None]:
    """The generators set to ``states`` inside, and back to where they were after (as checkpointing does)."""
    cpu, accelerator = states
    with torch.random.fork_rng(devices=[device] if accelerator is not None else [], device_type=device.type):
        torch.set_rng_state(cpu)
        if accelerator is not None:
            torch.cuda.set_rng_state(accelerator, device)
        yield


class _BlockedAttention(torch.autograd.Function):
    """`ContextParallel.attention` with gradients: keeps this rank's q, k and v only; the backward gathers the
    keys and values again and runs each block's attention again (with the forward's random state, for attention
    dropout), accumulating the block's key/value gradients into the whole sequence's, which a reduce-scatter
    returns to their owners. Autograd's own slicing would allocate a zero gradient of the whole sequence per
    block and keep the gathered keys and values."""

    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, context: ContextParallel,
                heads_per_group: int, attend: Attend) -> torch.Tensor:
        ctx.context, ctx.heads_per_group, ctx.attend = context, heads_per_group, attend
        ctx.rng = _rng_states(q.device)
        ctx.save_for_backward(q, k, v)
        return context.blocked_attention(q, k, v, heads_per_group, attend)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        dq, dkv = _BlockedAttention._gradients(ctx, grad)  # the gathered keys/values and the mask go on return
        dk, dv = ctx.context.to_owners(dkv, seq_dim=3)
        return dq, dk, dv, None, None, None

    @staticmethod
    def _gradients(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """dq [batch, heads, local seq, head_dim] and the stacked dk, dv of the whole sequence [2, batch, groups,
        seq, head_dim] (sequence order), summed over this rank's blocks."""
        q, k, v = ctx.saved_tensors
        context: ContextParallel = ctx.context
        kv = context.whole_sequence(torch.stack((k, v)), seq_dim=3)
        dq, dkv = torch.empty_like(q), torch.zeros_like(kv)
        with _replayed_rng(ctx.rng, q.device), torch.enable_grad():
            for queries, keys, mask in context.blocks(q.shape[2], q.dtype, q.device):
                block_q, block_k, block_v = (t.detach().requires_grad_() for t in (q[:, :, queries], kv[0, :, :, :keys],
                                                                                   kv[1, :, :, :keys]))
                out = ctx.attend(block_q, *_repeat_heads(block_k, block_v, ctx.heads_per_group), mask)
                dq[:, :, queries], dk, dv = torch.autograd.grad(out, (block_q, block_k, block_v), grad[:, :, queries])
                dkv[0, :, :, :keys] += dk
                dkv[1, :, :, :keys] += dv
                del out, dk, dv  # a block's gradients go before the next block's are allocated
        return dq, dkv


def _repeat_heads(k: torch.Tensor, v: torch.Tensor, heads_per_group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys and values [batch, groups, keys, head_dim] repeated over each group's query heads."""
    if heads_per_group == 1:
        return k, v
    return k.repeat_interleave(heads_per_group, dim=1), v.repeat_interleave(heads_per_group, dim=1)


class ContextParallel:
    """A run's cp group as the attention sees it: gather keys/values, the mask of the local queries."""

    def __init__(self, group: dist.ProcessGroup) -> None:
        self.group = group
        self.layout = ContextLayout(size=dist.get_world_size(group), rank=dist.get_rank(group))
        self._buffer: torch.Tensor | None = None

    def _collective_buffer(self, shape: torch.Size, like: torch.Tensor) -> torch.Tensor:
        """A contiguous tensor of ``shape`` (``like``'s dtype and device) on one buffer that every gather and
        reduce of the run reuses (as Megatron's global memory buffer serves sequence parallelism's gathers): the
        collectives' tensors stay this object's, whichever thread a backend releases them on, and a step
        allocates no new sequence-long buffer per layer for them."""
        numel = math.prod(shape)
        buffer = self._buffer
        if buffer is None or buffer.numel() < numel or buffer.dtype != like.dtype or buffer.device != like.device:
            buffer = self._buffer = like.new_empty(numel)
        return buffer[:numel].view(shape)

    def whole_sequence(self, x: torch.Tensor, seq_dim: int) -> torch.Tensor:
        """Every cp rank's ``x`` (this rank's tokens along ``seq_dim``) as the whole sequence, in sequence order
        (one collective; no autograd)."""
        order = torch.argsort(self.layout.gathered_indices(x.shape[seq_dim], x.device))
        local = x.movedim(seq_dim, 0).contiguous()
        gathered = self._collective_buffer(torch.Size((self.layout.size * local.shape[0], *local.shape[1:])), local)
        _all_gather_into(gathered, local, self.group)
        return gathered.movedim(0, seq_dim).index_select(seq_dim, order)

    def to_owners(self, grad: torch.Tensor, seq_dim: int) -> torch.Tensor:
        """The adjoint of `whole_sequence`: this rank's tokens of ``grad`` (the whole sequence along ``seq_dim``,
        in sequence order) summed over the cp ranks, since every rank's queries used every rank's keys."""
        gathered_order = self.layout.gathered_indices(grad.shape[seq_dim] // self.layout.size, grad.device)
        moved = grad.movedim(seq_dim, 0)
        # One copy: the reorder writes the collective's contiguous, sequence-first input.
        full = torch.index_select(moved, 0, gathered_order, out=self._collective_buffer(moved.shape, grad))
        return _reduce_scatter(full, self.group).movedim(0, seq_dim)

    def blocks(self, local_len: int, dtype: torch.dtype,
               device: torch.device) -> Iterator[tuple[slice, int, torch.Tensor]]:
        """This rank's query blocks in order: (its local query positions, the keys it attends (a prefix of the
        sequence), its additive causal mask [block, keys], a view of one `block_causal_mask`). Each chunk's
        queries go in blocks of `QUERY_BLOCK` (the last one of a chunk may be shorter)."""
        seq_len = local_len * self.layout.size
        chunk = local_len // CHUNKS_PER_RANK
        rows = min(QUERY_BLOCK, chunk)
        mask = block_causal_mask(rows, seq_len, dtype, device)
        for index, start in enumerate(self.layout.chunk_starts(seq_len)):
            for offset in range(0, chunk, rows):
                block = min(rows, chunk - offset)
                first = index * chunk + offset
                keys = start + offset + block
                yield slice(first, first + block), keys, mask[rows - block:, seq_len - keys:]

    def blocked_attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, heads_per_group: int,
                          attend: Attend) -> torch.Tensor:
        """`attention` without autograd: the whole sequence's keys and values gathered once, then each block."""
        kv = self.whole_sequence(torch.stack((k, v)), seq_dim=3)
        return torch.cat([attend(q[:, :, queries], *_repeat_heads(kv[0, :, :, :keys], kv[1, :, :, :keys],
                                                                  heads_per_group), mask)
                          for queries, keys, mask in self.blocks(q.shape[2], q.dtype, q.device)], dim=2)

    def attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, heads_per_group: int,
                  attend: Attend) -> torch.Tensor:
        """Causal attention of this rank's queries over the whole sequence's keys and values.

        Args:
            q: [batch, heads, local seq, head_dim], this rank's queries (after rope, at their true positions).
            k, v: [batch, groups, local seq, head_dim], this rank's keys and values; each group serves
                ``heads_per_group`` consecutive query heads (gathered as groups, before the repeat).
            attend: the attention of one block (`Attend`); it gets keys and values repeated over the heads.

        Returns:
            [batch, heads, local seq, head_dim].

        Each chunk's queries go in blocks of `QUERY_BLOCK`, each against the keys up to its last position: no
        keys after a block are computed with, and no mask is larger than `QUERY_BLOCK` x sequence. When
        gradients are recorded, what the call keeps for the backward is this rank's q, k and v, not the gathered
        keys and values nor a mask (`_BlockedAttention`; Transformer Engine's all-gather attention also gathers
        again in the backward).
        """
        if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
            return _BlockedAttention.apply(q, k, v, self, heads_per_group, attend)
        return self.blocked_attention(q, k, v, heads_per_group, attend)

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
