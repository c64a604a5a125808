"""Special tokens written as text: `<extra_id_0>`, `</s>`, `[CLS]`, `<|endoftext|>` encode to their ids and
decode back to their names, whatever the tokenizer kind.

    tok = with_special_tokens(build_tokenizer(config), {"<extra_id_0>": 32099})
    tok.encode("Hello <extra_id_0>.")  # [..., 32099, ...]
    tok.decode([..., 32099, 1])        # "Hello <extra_id_0> . </s>"

This is for prompts and for showing ids (generation, inspection), not for preprocessing: Megatron's
tokenizers encode such strings in documents literally, and `preprocess-data` keeps its bytes.
A tokenizer's own special tokens are its `special_tokens` (name -> id); ids appended after its
vocabulary (T5's sentinels, Megatron's [BOS]/[EOS]) are named by the caller.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import numpy as np

from .base import Tokenizer

# How the text of the runs between special tokens and the special tokens' names are joined on decode
# (as Megatron's SentencePieceTokenizer and `samplers.t5.dataset.format_t5_ids` join them).
DECODE_SEPARATOR = " "


class SpecialTokenText(Tokenizer):
    """A tokenizer that cuts text at special-token names and decodes special ids to their names.

    Args:
        inner: the tokenizer of the text between special tokens.
        names: special token name -> id (the inner tokenizer's own and any appended after its vocabulary).
    """

    def __init__(self, inner: Tokenizer, names: Mapping[str, int]) -> None:
        self.inner = inner
        self.special_tokens = dict(names)
        self._names_of = {token_id: name for name, token_id in self.special_tokens.items()}
        self.vocab_size = max([inner.vocab_size, *(token_id + 1 for token_id in self._names_of)])
        self._eod, self.pad, self.eod_missing = inner._eod, inner.pad, inner.eod_missing
        # Longest name first: a name that is a prefix of another never cuts the longer one.
        ordered = sorted(self.special_tokens, key=len, reverse=True)
        self._pattern = re.compile("|".join(map(re.escape, ordered))) if ordered else None

    def encode(self, text: str) -> list[int]:
        if self._pattern is None:
            return self.inner.encode(text)
        prefix, suffix = self.inner.affixes
        ids: list[int] = list(prefix)
        start = 0
        for match in self._pattern.finditer(text):
            if match.start() > start:
                ids += self.inner.encode_plain(text[start:match.start()])
            ids.append(self.special_tokens[match.group()])
            start = match.end()
        if start < len(text):
            ids += self.inner.encode_plain(text[start:])
        return ids + list(suffix)

    def decode(self, ids) -> str:
        parts, run = [], []
        for token in np.asarray(ids).tolist():
            name = self._names_of.get(token)
            if name is None:
                run.append(token)
                continue
            if run:
                parts.append(self.inner.decode(run))
            parts.append(name)
            run = []
        if run:
            parts.append(self.inner.decode(run))
        return _join([part for part in parts if part])


def _join(parts: list[str]) -> str:
    """The parts joined by `DECODE_SEPARATOR` where neither side already has whitespace (byte-level BPE
    keeps its own spaces, so its text round-trips exactly)."""
    text = ""
    for part in parts:
        if text and not text[-1].isspace() and not part[0].isspace():
            text += DECODE_SEPARATOR
        text += part
    return text


def with_special_tokens(tokenizer: Tokenizer, appended: Mapping[str, int] | None = None) -> SpecialTokenText:
    """``tokenizer`` reading and writing its special tokens (and ``appended`` ones) by name."""
    if isinstance(tokenizer, SpecialTokenText):
        return SpecialTokenText(tokenizer.inner, {**tokenizer.special_tokens, **(appended or {})})
    return SpecialTokenText(tokenizer, {**tokenizer.special_tokens, **(appended or {})})
