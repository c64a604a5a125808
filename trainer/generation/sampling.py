"""Choosing the next token from logits: greedy, or sampling with temperature, top-k and top-p.

The filters apply in transformers' order (temperature, then top-k, then top-p) with its top-p rule:
drop the least likely tokens whose cumulative probability stays within ``1 - top_p``, keeping at least
one. Sampling draws from an explicit ``torch.Generator``, so a seed fixes the output, and every
tensor-parallel rank, holding the same logits and seed, draws the same tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True)
class SamplingConfig:
    """How the next token is chosen."""

    greedy: bool = False
    """Always take the most likely token (the other fields are then ignored)."""
    temperature: float = 1.0
    """Divide the logits by this before sampling."""
    top_k: int = 0
    """Sample among the k most likely tokens only (0 = all)."""
    top_p: float = 1.0
    """Sample among the most likely tokens whose probabilities sum to top_p (1 = all)."""

    def __post_init__(self) -> None:
        if not (math.isfinite(self.temperature) and self.temperature > 0):
            raise ValueError(f"temperature must be a finite number > 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")


def filter_logits(logits: torch.Tensor, config: SamplingConfig) -> torch.Tensor:
    """Temperature-scaled logits [batch, vocab] with the tokens top-k/top-p exclude set to -inf."""
    scores = logits / config.temperature
    if 0 < config.top_k < scores.shape[-1]:
        kth_best = torch.topk(scores, config.top_k, dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth_best, float("-inf"))
    if config.top_p < 1.0:
        ascending, order = torch.sort(scores, dim=-1)
        cumulative = ascending.softmax(dim=-1).cumsum(dim=-1)
        remove = cumulative <= 1.0 - config.top_p
        remove[..., -1] = False  # the most likely token always stays
        scores = scores.masked_fill(remove.scatter(-1, order, remove), float("-inf"))
    return scores


def next_tokens(logits: torch.Tensor, config: SamplingConfig, generator: torch.Generator | None) -> torch.Tensor:
    """The next token of every row: int64 [batch] from float logits [batch, vocab]."""
    if config.greedy:
        return logits.argmax(dim=-1)
    probs = filter_logits(logits.float(), config).softmax(dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)
