"""`PretransposedHead`: a model's output head as ``h @ W.T`` with ``W.T`` stored contiguous, the decoding
and scoring copy that GPT's and T5's sharded models put in place of a plain (not tensor-parallel) head
on CPU once their weights are loaded."""

from __future__ import annotations

import torch
from torch import nn


class PretransposedHead(nn.Module):
    """The output head as ``h @ W.T`` with ``W.T`` stored contiguous (an inference-only copy).

    While decoding, the head is a matrix-vector product over the whole vocabulary. On CPU that is
    where ``F.linear`` is slowest: GPT-2's 50257 x 768 head at batch 1 on one thread takes ~12 ms
    through ``F.linear`` and ~6 ms against a contiguous transpose (about a quarter of a GPT-2-small
    step; benchmarks/generate.py times the whole loop).
    """

    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("weight_t", weight.detach().t().contiguous(), persistent=False)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """h: [..., hidden] -> logits [..., vocab rows of the weight]."""
        return h @ self.weight_t
