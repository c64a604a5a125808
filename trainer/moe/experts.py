"""The experts of a MoE layer as stacked weights ``[E_local, in, out]`` and the grouped matrix product over them.

Tokens arrive sorted by expert, ``counts[g]`` rows for expert g; one grouped GEMM computes every expert's
rows at once. Backends (chosen per call by `select_backend`, each choice logged once):

- ``grouped_mm``: ``torch._grouped_mm``: on CUDA (compute capability 9.0+, bfloat16) one kernel; on the
  CPU (torch 2.9+, operands with 16-byte-aligned rows) torch's own loop of one matmul per expert in C++,
  forward and backward, with no padding;
- ``segmented`` (CPU where ``torch._grouped_mm`` cannot run): the same in Python (`SegmentedMatmul`): one
  ``torch.mm`` per expert on its contiguous slice of the sorted rows, written in place into one output,
  each expert's weight gradient computed straight into its slice;
- ``batched`` (CUDA without ``torch._grouped_mm``): rows padded per expert to the largest group and one
  ``torch.bmm`` (one launch instead of E);
- ``loop``: the naive per-expert loop (split, matmul, concatenate, autograd through ``weight[g]``): the
  reference, and the benchmark's baseline.

All four compute the same products (each output row is one row times one expert's matrix).
"""

from __future__ import annotations

import functools
import logging

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor

logger = logging.getLogger(__name__)

GROUPED_MM, SEGMENTED, BATCHED, LOOP = "grouped_mm", "segmented", "batched", "loop"
BACKENDS = (GROUPED_MM, SEGMENTED, BATCHED, LOOP)
ACTIVATIONS = ("gelu", "relu", "gated-gelu", "swiglu")
# The gated activations: a third stacked weight w3 (the up projection) multiplies the activated w1 x.
GATED_ACTIVATIONS = ("gated-gelu", "swiglu")
# torch._grouped_mm's kernels (CUTLASS, sm90) need Hopper or newer.
GROUPED_MM_MIN_CAPABILITY = (9, 0)
# ... and, on every device, operands whose rows are 16-byte aligned (torch checks the strides): sizes a
# multiple of 8 bfloat16 or 4 float32 elements.
GROUPED_MM_ALIGNMENT_BYTES = 16


@functools.cache
def log_backend(backend: str, reason: str) -> None:
    """Say once per process (on rank 0) which grouped-GEMM path the experts use, and why."""
    if not dist.is_initialized() or dist.get_rank() == 0:
        logger.info("MoE experts: %s grouped GEMM (%s)", backend, reason)


@functools.cache
def cpu_grouped_mm_available(dtype: torch.dtype) -> bool:
    """Whether this torch runs ``torch._grouped_mm`` on the CPU for ``dtype`` (torch 2.9+; earlier ones
    have CUDA kernels only)."""
    try:
        x, weight = torch.zeros(2, 8, dtype=dtype), torch.zeros(2, 8, 8, dtype=dtype)
        torch._grouped_mm(x, weight, offs=torch.tensor([1, 2], dtype=torch.int32))
    except (AttributeError, NotImplementedError, RuntimeError):
        return False
    return True


def _aligned(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether the rows of ``x`` and of every product with ``weight`` [E, in, out] are 16-byte aligned."""
    alignment = GROUPED_MM_ALIGNMENT_BYTES // x.element_size()
    return not any(size % alignment for size in weight.shape[1:])


def select_backend(x: torch.Tensor, weight: torch.Tensor) -> str:
    """``grouped_mm`` where the device supports it for these operands; else ``segmented`` on the CPU and
    ``batched`` elsewhere."""
    shapes = f"{x.dtype} {tuple(weight.shape[1:])}"
    if x.device.type == "cpu":
        # Measured (benchmarks/moe.py): per-expert products on contiguous rows beat the padded bmm on the CPU,
        # which spends FLOPs and memory traffic on the padding and on moving rows in and out of it.
        if not cpu_grouped_mm_available(x.dtype):
            log_backend(SEGMENTED, f"torch {torch.__version__} has no CPU torch._grouped_mm for {x.dtype}")
            return SEGMENTED
        if not _aligned(x, weight):
            log_backend(SEGMENTED, f"torch._grouped_mm needs rows of a multiple of {GROUPED_MM_ALIGNMENT_BYTES} "
                                   f"bytes, got {shapes}")
            return SEGMENTED
        log_backend(GROUPED_MM, "torch._grouped_mm on the CPU: one matmul per expert, no padding")
        return GROUPED_MM
    if x.device.type != "cuda":
        log_backend(BATCHED, f"torch._grouped_mm needs CUDA or the CPU, tokens are on {x.device.type}")
        return BATCHED
    if torch.cuda.get_device_capability(x.device) < GROUPED_MM_MIN_CAPABILITY:
        log_backend(BATCHED, "torch._grouped_mm needs compute capability 9.0+")
        return BATCHED
    if x.dtype != torch.bfloat16 or not _aligned(x, weight):
        log_backend(BATCHED, f"torch._grouped_mm needs bfloat16 operands with rows of a multiple of "
                             f"{GROUPED_MM_ALIGNMENT_BYTES} bytes, got {shapes}")
        return BATCHED
    log_backend(GROUPED_MM, f"torch._grouped_mm on {torch.cuda.get_device_name(x.device)}")
    return GROUPED_MM


def grouped_matmul(x: torch.Tensor, weight: torch.Tensor, counts: torch.Tensor, backend: str) -> torch.Tensor:
    """Row block g of ``x`` times ``weight[g]``.

    Args:
        x: [N, K], rows sorted by group, N = counts.sum().
        weight: [G, K, M].
        counts: int64 [G], rows per group (zeros allowed).
        backend: one of `BACKENDS`.

    Returns:
        [N, M] in x's dtype.
    """
    if backend == GROUPED_MM:
        offsets = counts.cumsum(0).to(torch.int32)
        return torch._grouped_mm(x, weight, offs=offsets)
    if backend == SEGMENTED:
        return SegmentedMatmul.apply(x, weight, counts.tolist())
    if backend == LOOP:
        blocks = x.split(counts.tolist())
        return torch.cat([block @ weight[g] for g, block in enumerate(blocks)]) if len(x) else x @ weight[0]
    return _batched_matmul(x, weight, counts)


class SegmentedMatmul(torch.autograd.Function):
    """Row block g of x [N, K] times weight[g] [K, M], one ``torch.mm`` per block into one [N, M] output.

    The backward runs the same per-block products (x's gradient block by block, weight[g]'s gradient from
    block g alone, zero for an empty block): the numbers of the per-expert loop without its concatenations
    and without autograd's [G, K, M] zero-filled gradient per ``weight[g]`` selection.
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, splits: list[int]) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        ctx.splits = splits
        out = x.new_empty(x.shape[0], weight.shape[2])
        for g, rows in _segments(splits):
            torch.mm(x[rows], weight[g], out=out[rows])
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, weight = ctx.saved_tensors
        grad = grad.contiguous()
        grad_x = grad.new_empty(x.shape) if ctx.needs_input_grad[0] else None
        grad_weight = grad.new_zeros(weight.shape) if ctx.needs_input_grad[1] else None
        for g, rows in _segments(ctx.splits):
            if grad_x is not None:
                torch.mm(grad[rows], weight[g].t(), out=grad_x[rows])
            if grad_weight is not None:
                torch.mm(x[rows].t(), grad[rows], out=grad_weight[g])
        return grad_x, grad_weight, None


def _segments(splits: list[int]):
    """(group, row slice) of every non-empty group of a group-sorted matrix with ``splits`` rows per group."""
    start = 0
    for g, count in enumerate(splits):
        if count:
            yield g, slice(start, start + count)
        start += count


def _padded_slots(counts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(group, position within the group) of every row of a group-sorted matrix: its slot in the padded
    [G, max count, ...] layout of the ``batched`` backend."""
    group_of_row = torch.repeat_interleave(torch.arange(len(counts), device=counts.device), counts)
    starts = counts.cumsum(0) - counts
    position = torch.arange(len(group_of_row), device=counts.device) - starts[group_of_row]
    return group_of_row, position


def _pad(x: torch.Tensor, slots: tuple[torch.Tensor, torch.Tensor], groups: int, rows: int) -> torch.Tensor:
    """[N, K] -> [G, rows, K], zeros in the padding."""
    return x.new_zeros(groups, rows, x.shape[1]).index_put(slots, x)


def _batched_matmul(x: torch.Tensor, weight: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """Pad every group to the largest one, one bmm, and keep the real rows."""
    if len(x) == 0:
        return x @ weight[0]
    slots = _padded_slots(counts)
    return torch.bmm(_pad(x, slots, weight.shape[0], int(counts.max())), weight)[slots]


class StackedWeight(nn.Module):
    """``weight`` [E, in, out]: one matrix per expert (``x @ weight[e]``; HF's ``nn.Linear`` weight transposed)."""

    def __init__(self, num_experts: int, in_features: int, out_features: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_experts, in_features, out_features))

    def local(self) -> torch.Tensor:
        """This rank's experts (the local shard under expert parallelism)."""
        return self.weight.to_local() if isinstance(self.weight, DTensor) else self.weight


class GroupedExperts(nn.Module):
    """E two-layer MLPs without biases: ``w2(act(w1 x))``, or gated ``w2(gelu(w1 x) * w3 x)`` /
    ``w2(silu(w1 x) * w3 x)`` (swiglu, Mixtral's experts).

    Parameter names ``w1.weight``/``w2.weight``/``w3.weight`` follow the dense MLPs', so a family's
    initialisation rules for its MLP apply to its experts unchanged.
    """

    compile_parts_only = True
    """`trainer.parallel.parallelize.apply_compile` leaves the forward eager: its grouped products take per-expert row
    counts (read on the host by the CPU paths) and its path is chosen per call."""

    def __init__(self, num_experts: int, hidden_size: int, ffn_hidden_size: int, activation: str,
                 backend: str | None = None) -> None:
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
        self.activation = activation
        self.w1 = StackedWeight(num_experts, hidden_size, ffn_hidden_size)
        self.w3 = StackedWeight(num_experts, hidden_size, ffn_hidden_size) if activation in GATED_ACTIVATIONS else None
        self.w2 = StackedWeight(num_experts, ffn_hidden_size, hidden_size)
        self.backend = backend
        """None: `select_backend` decides per call; a `BACKENDS` entry forces one (tests, benchmarks)."""

    def forward(self, x: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """x [N, hidden] sorted by local expert, ``counts`` int64 [E_local] -> [N, hidden]."""
        w1, w2 = self.w1.local(), self.w2.local()
        if torch.is_autocast_enabled(x.device.type):
            # Autocast does not cover torch._grouped_mm: cast operands as it casts a linear's.
            dtype = torch.get_autocast_dtype(x.device.type)
            x, w1, w2 = x.to(dtype), w1.to(dtype), w2.to(dtype)
        w3 = self.w3.local().to(x.dtype) if self.w3 is not None else None
        backend = self.backend or select_backend(x, w1)
        if backend == GROUPED_MM:
            offsets = counts.cumsum(0).to(torch.int32)  # once for the two or three products
            return self._mlp(x, w1, w2, w3, lambda rows, weight: torch._grouped_mm(rows, weight, offs=offsets))
        if backend == SEGMENTED:
            splits = counts.tolist()  # once (a host copy on the CPU, where it runs)
            return self._mlp(x, w1, w2, w3, lambda rows, weight: SegmentedMatmul.apply(rows, weight, splits))
        if backend == BATCHED and len(x):
            # Pad once for all the matmuls: the padding rows are zeros, stay zeros through the activation
            # (act(0) = 0) and are dropped at the end.
            slots = _padded_slots(counts)
            padded = _pad(x, slots, len(counts), int(counts.max()))
            return self._mlp(padded, w1, w2, w3, torch.bmm)[slots]
        return self._mlp(x, w1, w2, w3, lambda rows, weight: grouped_matmul(rows, weight, counts, backend))

    def _mlp(self, x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, w3: torch.Tensor | None, matmul) -> torch.Tensor:
        """The experts' MLP with ``matmul(rows, stacked weight)`` as the grouped product."""
        hidden = matmul(x, w1)
        if self.activation == "relu":
            hidden = F.relu(hidden)
        elif self.activation == "gelu":
            hidden = F.gelu(hidden, approximate="tanh")
        elif self.activation == "swiglu":
            hidden = F.silu(hidden) * matmul(x, w3)
        else:
            hidden = F.gelu(hidden, approximate="tanh") * matmul(x, w3)
        return matmul(hidden, w2)
