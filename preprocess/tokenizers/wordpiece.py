"""Megatron's BertWordPieceLowerCase / BertWordPieceCase: BERT WordPiece from a `vocab.txt`.

Ids are BertTokenizerFast's without special tokens (Megatron's legacy `tokenize`; megatron-core's
tokenizers at Megatron HEAD wrap each text in [CLS] ... [SEP], which `add_special_tokens` reproduces);
the uncased variant lower-cases and strips accents. BERT has no end-of-document token, so eod is `[SEP]`, the token that
separates segments in BERT's own inputs.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from tokenizers import BertWordPieceTokenizer

from ..errors import EncodeError, TokenizerError
from .base import RaggedTokens, Tokenizer, as_large_strings
from .files import require_file


class WordPieceTokenizer(Tokenizer):
    """BERT WordPiece through Hugging Face `tokenizers` (its batch encode is parallel in Rust)."""

    def __init__(self, vocab_file: str, lower_case: bool, add_special_tokens: bool = False) -> None:
        require_file(vocab_file, "WordPiece vocab file")
        try:
            self.backend = BertWordPieceTokenizer(vocab_file, lowercase=lower_case)
        except Exception as error:  # tokenizers raises a bare Exception for malformed files
            raise TokenizerError(f"{vocab_file}: cannot read WordPiece vocab: {error}") from None
        self.vocab_size = self.backend.get_vocab_size()
        self._eod = self.backend.token_to_id("[SEP]")
        self.pad = self.backend.token_to_id("[PAD]")
        self.add_special_tokens = add_special_tokens
        self.special_tokens = added_special_tokens(self.backend)
        wrap = ((self.backend.token_to_id("[CLS]"),), (self._eod,))
        self.affixes = wrap if add_special_tokens else ((), ())

    def encode(self, text: str) -> list[int]:
        return self.backend.encode(text, add_special_tokens=self.add_special_tokens).ids

    def encode_plain(self, text: str) -> list[int]:
        return self.backend.encode(text, add_special_tokens=False).ids

    def decode(self, ids) -> str:
        return self.backend.decode(np.asarray(ids).tolist())

    def encode_batch(self, texts: pa.Array | list[str]) -> RaggedTokens:
        return encode_batch_hf(self.backend, texts, add_special_tokens=self.add_special_tokens)


def added_special_tokens(backend) -> dict[str, int]:
    """Name -> id of the special added tokens of a Hugging Face `tokenizers` object ([CLS], </s>, ...)."""
    return {token.content: token_id for token_id, token in backend.get_added_tokens_decoder().items() if token.special}


def encode_batch_hf(backend, texts: pa.Array | list[str], add_special_tokens: bool) -> RaggedTokens:
    """Batch encode with a Hugging Face `tokenizers` object.

    Raises:
        EncodeError: a text `tokenizers` rejects; `index` is its position in the batch.
    """
    strings = as_large_strings(texts).to_pylist()
    try:
        encodings = backend.encode_batch(strings, add_special_tokens=add_special_tokens)
    except Exception:  # tokenizers raises a bare Exception; find the text it refused
        for index, text in enumerate(strings):
            try:
                backend.encode(text, add_special_tokens=add_special_tokens)
            except Exception as error:
                raise EncodeError(index, f"tokenizer failed: {error}") from None
        raise
    return RaggedTokens.from_lists([encoding.ids for encoding in encodings])
