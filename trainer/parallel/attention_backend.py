"""Megatron's ``--attention-backend`` onto the kernels of torch's ``scaled_dot_product_attention``.

Megatron chooses among Transformer Engine's flash and fused (cuDNN) attention, and its own unfused
(``local``: megatron-core's DotProductAttention) softmax(q k^T) v; every family here computes attention with
SDPA, so the choice is which of SDPA's backends may run (``torch.nn.attention.sdpa_kernel``, held for the
whole run):

    auto      SDPA's own choice among all of them
    flash     FLASH_ATTENTION (on a CPU: torch's CPU flash kernel)
    fused     EFFICIENT_ATTENTION and CUDNN_ATTENTION (CUDA only)
    unfused   MATH: softmax(q k^T) v in PyTorch ops
    local     MATH (as unfused)

A backend the device does not have for the run's dtype is refused before the run starts (`attention_kernels`
tries one small causal attention under it). Attention that applies keyed dropout to its probabilities
computes them in PyTorch ops whatever the backend (`trainer.parallel.keyed_dropout.attention`).
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from trainer.errors import TrainConfigError

BACKENDS: dict[str, tuple[SDPBackend, ...] | None] = {
    "auto": None,
    "flash": (SDPBackend.FLASH_ATTENTION,),
    "fused": (SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION),
    "unfused": (SDPBackend.MATH,),
    "local": (SDPBackend.MATH,),
}
ATTENTION_BACKENDS = tuple(BACKENDS)
# The probe's shape [batch, heads, seq, head_dim]: the smallest that every kernel takes (head_dim a multiple of 8).
PROBE_SHAPE = (1, 1, 8, 8)


def backend_names(backend: str) -> str:
    """The SDPA kernels ``backend`` allows, in words (for the log)."""
    kernels = BACKENDS[backend]
    return "any (torch chooses)" if kernels is None else ", ".join(kernel.name for kernel in kernels)


@contextlib.contextmanager
def attention_kernels(backend: str, device: torch.device, dtype: torch.dtype) -> Iterator[None]:
    """Hold SDPA to the kernels of ``backend`` (one of `ATTENTION_BACKENDS`) while the block runs.

    Args:
        device: where attention runs.
        dtype: what it computes in (autocast's dtype, or float32).

    Raises:
        TrainConfigError: none of the backend's kernels runs a causal attention on ``device`` in ``dtype``.
    """
    kernels = BACKENDS[backend]
    if kernels is None:
        yield
        return
    with sdpa_kernel(list(kernels)):
        q = torch.zeros(PROBE_SHAPE, device=device, dtype=dtype)
        try:
            with warnings.catch_warnings():  # SDPA warns why each kernel declined, then raises: one line instead
                warnings.simplefilter("ignore")
                F.scaled_dot_product_attention(q, q, q, is_causal=True)
        except RuntimeError:
            raise TrainConfigError(f"attention_backend {backend} ({backend_names(backend)}): torch "
                                   f"{torch.__version__} has no such attention kernel for {dtype} on "
                                   f"{device.type}; use attention_backend auto or unfused") from None
        yield
