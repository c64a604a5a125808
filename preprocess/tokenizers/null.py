"""Megatron's NullTokenizer: the text already holds the ids, as space-separated integers."""

from __future__ import annotations

import numpy as np

from .base import Tokenizer

INT64 = np.iinfo(np.int64)


class NullTokenizer(Tokenizer):
    """Ids parsed from whitespace-separated integers; eod = vocab_size - 1, no pad.

    Ids are not checked against vocab_size (as in Megatron); the writer checks that they fit the dtype.
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
        return ids

    def decode(self, ids) -> str:
        return " ".join(str(token) for token in np.asarray(ids).tolist())
