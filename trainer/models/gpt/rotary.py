"""Rotary position embeddings as megatron-core computes them (``RotaryEmbedding``, ``apply_rotary_pos_emb``).

Non-interleaved ("rotate half", Llama/Hugging Face layout): of each head's ``d`` channels the first
``rot = int(d * rotary_percent)`` are rotated, the pairs being channel ``i`` and ``i + rot/2``; the rest
pass through. Frequencies ``inv_freq[j] = 1 / base^(2j / rot)``, optionally rescaled as Llama 3.1 does
(`llama3_scaled`), and the angle of position ``p`` is ``p / interpolation_factor * inv_freq``. Positions are
the model's ``position_ids``, so a KV-cached decode continues at the absolute position of each new token.

    cos, sin = rotary_tables(settings, position_ids)      # float32 [batch, seq, rot]
    q = apply_rotary(q, cos, sin)                         # q [batch, heads, seq, d]
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True)
class RotarySettings:
    """What the rotary tables depend on (the rope fields of the GPT shape)."""

    head_dim: int
    base: float = 10000.0
    percent: float = 1.0
    interpolation_factor: float | None = None
    """Plain linear scaling (Megatron's --rotary-seq-len-interpolation-factor): positions divided by it."""
    llama3_factor: float | None = None
    """Llama 3.1's frequency scaling factor (Megatron's --rope-scaling-factor with --use-rope-scaling)."""
    llama3_low_freq_factor: float = 1.0
    llama3_high_freq_factor: float = 4.0
    llama3_original_max_positions: int = 8192

    @property
    def rotary_dim(self) -> int:
        """Channels rotated per head (Megatron: int(kv_channels * rotary_percent) when the percent is below 1)."""
        return int(self.head_dim * self.percent) if self.percent < 1.0 else self.head_dim


def llama3_scaled(inv_freq: torch.Tensor, factor: float, low_freq_factor: float, high_freq_factor: float,
                  original_max_positions: int) -> torch.Tensor:
    """Llama 3.1's rescaling of ``inv_freq`` (float32 [rot/2]), as megatron-core's ``_apply_scaling``: wavelengths
    longer than original/low_freq_factor are divided by ``factor``, shorter than original/high_freq_factor kept,
    and those between interpolated smoothly."""
    low_freq_wavelen = original_max_positions / low_freq_factor
    high_freq_wavelen = original_max_positions / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (original_max_positions / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(medium, smoothed, scaled)


def inverse_frequencies(settings: RotarySettings, device: torch.device | None = None) -> torch.Tensor:
    """float32 [rot/2]: the rotation speed of each channel pair."""
    rot = settings.rotary_dim
    inv_freq = 1.0 / (settings.base ** (torch.arange(0, rot, 2, dtype=torch.float32, device=device) / rot))
    if settings.llama3_factor is not None:
        inv_freq = llama3_scaled(inv_freq, settings.llama3_factor, settings.llama3_low_freq_factor,
                                 settings.llama3_high_freq_factor, settings.llama3_original_max_positions)
    return inv_freq


def rotary_tables(settings: RotarySettings, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin, float32 [batch, seq, rot], of positions int64 [batch, seq] (computed per call: the model
    holds no buffer, so a meta-device build and ``to_empty`` leave nothing uninitialised)."""
    positions = position_ids.to(torch.float32)
    if settings.interpolation_factor is not None:
        positions = positions * (1 / settings.interpolation_factor)
    freqs = positions[..., None] * inverse_frequencies(settings, position_ids.device)
    angles = torch.cat((freqs, freqs), dim=-1)
    return angles.cos(), angles.sin()


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate q or k, [batch, heads, seq, d], by tables [batch, seq, rot] (cast to x's dtype, as Megatron)."""
    rot = cos.shape[-1]
    cos, sin = cos[:, None].to(x.dtype), sin[:, None].to(x.dtype)
    rotated, passed = x[..., :rot], x[..., rot:]
    rotated = rotated * cos + _rotate_half(rotated) * sin
    return torch.cat((rotated, passed), dim=-1) if passed.shape[-1] else rotated
