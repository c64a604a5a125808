"""What every tokenizer adapter offers: single-text encode/decode and a vectorised batch encode.

The batch path is what the preprocessing pipeline uses: texts come in as one Arrow `large_string`
array (UTF-8 bytes plus int64 offsets, no Python string per document) and tokens go out as one flat
array plus offsets, so no per-document Python work happens for the tokenizers that can avoid it.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np
import pyarrow as pa

from ..errors import EncodeError, TokenizerError

# Token ids travel as int64 when a tokenizer gives Python ints; gigatoken returns uint32 natively.
TOKEN_DTYPE = np.dtype(np.int64)


@dataclass(frozen=True)
class RaggedTokens:
    """Token ids of a batch of texts.

    Attributes:
        tokens: [N] ids of every text, concatenated (an integer dtype).
        offsets: int64 [B+1], text b is `tokens[offsets[b]:offsets[b+1]]`; starts at 0.
    """

    tokens: np.ndarray
    offsets: np.ndarray

    @property
    def lengths(self) -> np.ndarray:
        """int64 [B], tokens per text."""
        return np.diff(self.offsets)

    @classmethod
    def from_lists(cls, ids: list[list[int]] | list[np.ndarray]) -> "RaggedTokens":
        """Concatenate per-text id lists (the path for tokenizers without a flat batch output)."""
        lengths = np.fromiter((len(x) for x in ids), dtype=np.int64, count=len(ids))
        offsets = np.zeros(len(ids) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        if offsets[-1] == 0:
            return cls(np.zeros(0, dtype=TOKEN_DTYPE), offsets)
        return cls(np.concatenate([np.asarray(x, dtype=TOKEN_DTYPE) for x in ids]), offsets)


def as_large_strings(texts: pa.Array | list[str]) -> pa.LargeStringArray:
    """The batch input type: an Arrow `large_string` array without nulls."""
    if isinstance(texts, list):
        return pa.array(texts, type=pa.large_string())
    if texts.type != pa.large_string():
        texts = texts.cast(pa.large_string())
    return texts


class Tokenizer(abc.ABC):
    """A text tokenizer with Megatron's notion of special ids.

    Attributes:
        vocab_size: the tokenizer's own vocabulary size (ids are < vocab_size); chooses the token dtype.
        pad: padding id, or None when the tokenizer has none.
    """

    vocab_size: int
    pad: int | None = None
    _eod: int | None = None
    eod_missing: str = "the tokenizer defines no end-of-document token (eod)"
    """Why there is no eod, and what to give for one: the message of `eod` when `_eod` is None."""
    special_tokens: Mapping[str, int] = MappingProxyType({})
    """The tokenizer's own special tokens, name -> id (`specials.with_special_tokens` reads and writes
    them by name; `encode` itself follows Megatron, which may encode the names literally)."""
    affixes: tuple[tuple[int, ...], tuple[int, ...]] = ((), ())
    """(prefix, suffix): the ids `encode` puts around every text (a BOS, [CLS] ... [SEP]); `encode_plain`
    leaves them out."""
    parallel_batches: bool | None = None
    """Whether `encode_batch` may spread one batch over the tokenizer library's own thread pool
    (gigatoken's; None: the library decides). The encoders set it: off where their own threads already
    fill every core (see `preprocess.workers.spread_batches`)."""

    def encode_plain(self, text: str) -> list[int]:
        """Token ids of one text without `affixes` (a piece of a longer text)."""
        return self.encode(text)

    @property
    def eod(self) -> int:
        """End-of-document id, appended by `--append-eod`.

        Raises:
            TokenizerError: the tokenizer defines no end-of-document token.
        """
        if self._eod is None:
            raise TokenizerError(self.eod_missing)
        return self._eod

    @abc.abstractmethod
    def encode(self, text: str) -> list[int]:
        """Token ids of one text."""

    @abc.abstractmethod
    def decode(self, ids) -> str:
        """Text of a sequence of ids."""

    def encode_batch(self, texts: pa.Array | list[str]) -> RaggedTokens:
        """Token ids of many texts; the default loops over `encode`, adapters override it.

        Raises:
            EncodeError: a text cannot be tokenized; `index` is its position in `texts`.
        """
        ids = []
        for index, text in enumerate(as_large_strings(texts).to_pylist()):
            try:
                ids.append(self.encode(text))
            except EncodeError:
                raise
            except (ValueError, UnicodeError) as error:
                raise EncodeError(index, str(error)) from None
        return RaggedTokens.from_lists(ids)
