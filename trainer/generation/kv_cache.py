"""Key/value cache for incremental decoding of a left-padded batch.

Prompts of different lengths are left-padded to one length ``P``; ``prompt_mask`` marks the real
tokens. Keys and values go into buffers preallocated for ``max_length`` positions (no concatenation
per step). A query at absolute position ``t`` attends to key ``s`` iff ``s <= t`` and ``s`` is a real
token; a padding query attends to itself only, which keeps its (unused) output finite — a row with
every key masked would give NaN, and NaN times a zero attention weight is still NaN.

    cache = KVCache(prompt_mask, max_length=P + max_new_tokens)
    logits = model(tokens, positions, kv_cache=cache.step(num_tokens=P))        # prefill
    logits = model(next_tokens[:, None], next_positions, kv_cache=cache.step(1))  # one token
"""

from __future__ import annotations

import torch


class LayerKVCache:
    """One block's key/value buffers ([batch, local heads, max_length, head_dim], allocated on first use)."""

    def __init__(self, owner: KVCache) -> None:
        self.owner = owner
        self.keys: torch.Tensor | None = None
        self.values: torch.Tensor | None = None

    @property
    def attn_mask(self) -> torch.Tensor | None:
        return self.owner.attn_mask

    @property
    def is_causal(self) -> bool:
        return self.owner.is_causal

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store this step's keys/values [batch, heads, n, head_dim]; return all cached ones so far."""
        if self.keys is None:
            batch, heads, _, head_dim = k.shape
            self.keys = k.new_empty(batch, heads, self.owner.max_length, head_dim)
            self.values = v.new_empty(batch, heads, self.owner.max_length, head_dim)
        start, end = self.owner.start, self.owner.end
        self.keys[:, :, start:end] = k
        self.values[:, :, start:end] = v
        return self.keys[:, :, :end], self.values[:, :, :end]


class KVCache:
    """The cache of every block, and the attention mask of the current step.

    Args:
        prompt_mask: bool [batch, prompt_length], True at real (not padding) prompt tokens.
        max_length: prompt length plus the most tokens that will be generated.
    """

    def __init__(self, prompt_mask: torch.Tensor, max_length: int) -> None:
        batch, prompt_length = prompt_mask.shape
        self.max_length = max_length
        self.key_mask = torch.ones(batch, max_length, dtype=torch.bool, device=prompt_mask.device)
        self.key_mask[:, :prompt_length] = prompt_mask
        self.prompt_length = prompt_length
        self.padded = not bool(prompt_mask.all())
        self.layers: dict[str, LayerKVCache] = {}
        self.start = self.end = 0
        self.attn_mask: torch.Tensor | None = None
        self.is_causal = False

    def layer(self, name: str) -> LayerKVCache:
        """Block ``name``'s cache (created on first use: a pipeline stage only asks for its own blocks)."""
        if name not in self.layers:
            self.layers[name] = LayerKVCache(self)
        return self.layers[name]

    def step(self, num_tokens: int) -> KVCache:
        """Prepare a forward over the next ``num_tokens`` positions; returns self for the model call."""
        self.start, self.end = self.end, self.end + num_tokens
        if self.end > self.max_length:
            raise ValueError(f"KV cache holds {self.max_length} positions, step needs {self.end}")
        self.is_causal = False
        if not self.padded and (num_tokens == 1 or self.start == 0):
            # Without padding: a single query sees every cached key; a prefill is plainly causal.
            self.attn_mask, self.is_causal = None, num_tokens > 1
            return self
        if num_tokens == 1 and self.start >= self.prompt_length:
            # One generated (so real) token: it sees every real key so far, itself included.
            self.attn_mask = self.key_mask[:, None, None, :self.end]
            return self
        queries = torch.arange(self.start, self.end, device=self.key_mask.device)[:, None]
        keys = torch.arange(self.end, device=self.key_mask.device)[None, :]
        causal = keys <= queries
        allowed = (causal & self.key_mask[:, None, :self.end]) | (keys == queries)  # [batch, num_tokens, end]
        self.attn_mask = allowed[:, None]  # broadcast over heads
        return self
