"""Megatron's NullTokenizer: the text already holds the ids, as space-separated integers."""

from __future__ import annotations

import numpy as np

from .base import Tokenizer

INT64 = np.iinfo(np.int64)


class NullTokenizer(Tokenizer):
    """Ids parsed from whitespace-separated integers; eod = vocab_size - 1, no pad.

    Unlike Megatron, ids are checked against vocab_size: an id past it would index past a model's
    embedding table, and would only be caught (if at all) when it no longer fits the token dtype.
    """

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size
        self._eod = vocab_size - 1

    def encode(self, text: str) -> list[int]:
        try:
            ids = [int(field) for field in text.split()]
        except ValueError:
            raise ValueError(f"NullTokenizer needs space-separated integers, got {text[:40]!r}") from None
        if ids and not (INT64.min <= min(ids) and max(ids) <= INT64.max):
            raise ValueError(f"NullTokenizer id out of the int64 range in {text[:40]!r}")
        if ids and not (0 <= min(ids) and max(ids) < self.vocab_size):
            outside = next(token for token in ids if not 0 <= token < self.vocab_size)
            raise ValueError(f"NullTokenizer id {outside} does not fit the vocabulary of vocab_size "
                             f"{self.vocab_size} (ids 0..{self.vocab_size - 1})")
        return ids

    def decode(self, ids) -> str:
        return " ".join(str(token) for token in np.asarray(ids).tolist())
