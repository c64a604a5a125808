"""The decoder's norms: LayerNorm (GPT-2) or RMSNorm (Llama), optionally with zero-centred weights.

``build_norm("LayerNorm", h, eps, zero_centered=False)`` is a plain ``nn.LayerNorm`` (GPT-2's parameters and
numerics unchanged); ``"RMSNorm"`` a plain ``nn.RMSNorm`` (weight only). ``zero_centered`` is Megatron's
``--apply-layernorm-1p``: the stored weight is initialised to 0 and the norm scales by ``1 + weight``, so
weight decay pulls the scale towards 1 rather than 0. Hugging Face files hold the scale itself (ours + 1).

    norm = build_norm("RMSNorm", 4096, 1e-5, zero_centered=True)   # y = x / rms(x) * (1 + norm.weight)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

LAYER_NORM, RMS_NORM = "LayerNorm", "RMSNorm"


class ZeroCenteredLayerNorm(nn.LayerNorm):
    """LayerNorm scaling by ``1 + weight`` (weight and bias [size])."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, self.normalized_shape, self.weight + 1, self.bias, self.eps)


class ZeroCenteredRMSNorm(nn.RMSNorm):
    """RMSNorm scaling by ``1 + weight`` (weight [size])."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, self.normalized_shape, self.weight + 1, self.eps)


def build_norm(kind: str, size: int, eps: float, zero_centered: bool) -> nn.Module:
    """A norm over the last ``size`` channels: ``kind`` LayerNorm or RMSNorm, scale ``1 + weight`` when
    ``zero_centered``."""
    if kind == LAYER_NORM:
        return ZeroCenteredLayerNorm(size, eps=eps) if zero_centered else nn.LayerNorm(size, eps=eps)
    if kind == RMS_NORM:
        return ZeroCenteredRMSNorm(size, eps=eps) if zero_centered else nn.RMSNorm(size, eps=eps)
    raise ValueError(f"normalization must be {LAYER_NORM} or {RMS_NORM}, got {kind!r}")
