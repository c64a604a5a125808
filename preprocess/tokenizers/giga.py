"""Byte-level BPE and SentencePiece-BPE through gigatoken, the fast batch path.

gigatoken releases the GIL and encodes a batch on its own thread pool (sequentially inside a
multiprocessing worker), taking the batch zero-copy from the Arrow string buffers.
"""

from __future__ import annotations

import awkward as ak
import gigatoken
import numpy as np
import pyarrow as pa

from .base import RaggedTokens, Tokenizer, as_large_strings

# Texts that expose tokenizer differences (CJK, emoji with joiners and modifiers, combining accents,
# control characters, runs of spaces and newlines, a special token in the text, a very long word).
# A gigatoken backend is only used when it gives the reference tokenizer's ids on every one of them.
PROBE_TEXTS = (
    "Hello world! It's 2026, isn't it?",
    "日本語のテキスト、中文文本。한국어",
    "emoji 😀👍🏽 family 👨\u200d👩\u200d👧",
    "e\u0301 cafe\u0301 Å ﬁ",
    "ctl\x00\x01\x07\x1b[0m end",
    "   many   spaces\n\n\n\nnewlines\t\ttabs \r\n",
    "<|endoftext|> special <s> </s> [SEP]",
    "supercalifragilistic" * 40,
    " ",
    "",
)


def _awkward_strings(texts: pa.LargeStringArray) -> ak.Array:
    """A zero-copy awkward view of an Arrow large_string array (gigatoken's batch input)."""
    _, offsets_buffer, data_buffer = texts.buffers()
    offsets = np.frombuffer(offsets_buffer, dtype=np.int64)[texts.offset : texts.offset + len(texts) + 1]
    data = np.frombuffer(data_buffer, dtype=np.uint8) if data_buffer is not None else np.zeros(0, np.uint8)
    chars = ak.contents.NumpyArray(data, parameters={"__array__": "char"})
    layout = ak.contents.ListOffsetArray(ak.index.Index64(offsets), chars, parameters={"__array__": "string"})
    return ak.Array(layout)


def _ragged_from_awkward(array: ak.Array) -> RaggedTokens:
    layout = array.layout
    # gigatoken returns one flat buffer plus offsets: read them as they are (`ak.to_packed` costs ~0.1 ms
    # of dispatch per call even when there is nothing to pack); any other layout is packed first.
    if not (isinstance(layout, ak.contents.ListOffsetArray) and isinstance(layout.content, ak.contents.NumpyArray)):
        layout = ak.to_packed(array).layout
    offsets = np.asarray(layout.offsets.data, dtype=np.int64)
    tokens = np.asarray(layout.content.data)
    return RaggedTokens(tokens[offsets[0] : offsets[-1]], offsets - offsets[0])


def encode_batch_with(
    backend: gigatoken.Tokenizer, texts: pa.Array | list[str], parallel: bool | None = None
) -> RaggedTokens:
    """Encode a batch with a gigatoken tokenizer.

    Args:
        backend: the gigatoken tokenizer.
        texts: the batch.
        parallel: spread the batch over gigatoken's thread pool, or encode it on the calling thread (the
            ids are the same either way); None: gigatoken decides (the pool, except in a multiprocessing
            worker).

    Returns:
        ids as uint32 plus int64 offsets.
    """
    texts = as_large_strings(texts)
    if len(texts) == 0:
        return RaggedTokens(np.zeros(0, dtype=np.uint32), np.zeros(1, dtype=np.int64))
    if texts.null_count:
        raise ValueError("texts must not contain nulls")
    return _ragged_from_awkward(backend.encode_batch(_awkward_strings(texts), parallel=parallel))


def matches_reference(backend: gigatoken.Tokenizer, reference) -> bool:
    """Whether gigatoken gives `reference(text)` ids on every probe text."""
    return all(backend.encode(text).tolist() == list(reference(text)) for text in PROBE_TEXTS)


class GigatokenTokenizer(Tokenizer):
    """A tokenizer whose ids come from a gigatoken backend.

    Args:
        backend: the gigatoken tokenizer.
        vocab_size: the vocabulary size to report.
        eod: end-of-document id, or None.
        pad: padding id, or None.
        prefix: ids put before every text (e.g. a BOS the reference tokenizer adds).
        suffix: ids put after every text.
    """

    def __init__(
        self,
        backend: gigatoken.Tokenizer,
        vocab_size: int,
        eod: int | None,
        pad: int | None = None,
        prefix: tuple[int, ...] = (),
        suffix: tuple[int, ...] = (),
    ) -> None:
        self.backend = backend
        self.vocab_size = vocab_size
        self._eod = eod
        self.pad = pad
        self.prefix = tuple(prefix)
        self.suffix = tuple(suffix)
        self.affixes = (self.prefix, self.suffix)

    def encode(self, text: str) -> list[int]:
        return [*self.prefix, *self.backend.encode(text).tolist(), *self.suffix]

    def encode_plain(self, text: str) -> list[int]:
        return self.backend.encode(text).tolist()

    def decode(self, ids) -> str:
        return self.backend.decode(np.asarray(ids, dtype=np.uint32)).decode("utf-8", errors="replace")

    def encode_batch(self, texts: pa.Array | list[str]) -> RaggedTokens:
        encoded = encode_batch_with(self.backend, texts, self.parallel_batches)
        if not self.prefix and not self.suffix:
            return encoded
        return wrap_each(encoded, np.array(self.prefix, np.uint32), np.array(self.suffix, np.uint32))


def wrap_each(encoded: RaggedTokens, prefix: np.ndarray, suffix: np.ndarray) -> RaggedTokens:
    """Put `prefix` before and `suffix` after every text's ids, without a loop over texts."""
    offsets = np.zeros(len(encoded.offsets), dtype=np.int64)
    np.cumsum(encoded.lengths + len(prefix) + len(suffix), out=offsets[1:])
    tokens = np.empty(int(offsets[-1]), dtype=encoded.tokens.dtype)
    body = np.ones(len(tokens), dtype=bool)
    slots = [(offsets[:-1] + position, token) for position, token in enumerate(prefix)]
    slots += [(offsets[1:] - len(suffix) + position, token) for position, token in enumerate(suffix)]
    for index, token in slots:
        tokens[index] = token
        body[index] = False
    tokens[body] = encoded.tokens
    return RaggedTokens(tokens, offsets)
