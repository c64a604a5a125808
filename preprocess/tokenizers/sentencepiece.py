"""Megatron's SentencePieceTokenizer, GPTSentencePieceTokenizer and Llama2Tokenizer, from a SentencePiece `.model`.

GPTSentencePieceTokenizer is the plain model: ids = `encode_as_ids(text)`, eod = the model's EOS.
Llama2Tokenizer (Megatron's `_Llama2Tokenizer`, e.g. Llama 2's `tokenizer.model`) is the same model with the
model's BOS put before every text (`tokenize(s, bos=True, eos=False)`): eod = EOS, pad = the model's PAD
(None when it has none, as Llama 2's), vocabulary = the model's pieces.
SentencePieceTokenizer is Megatron's T5/BERT flavour: it appends `<CLS> <SEP> <EOD> <MASK>` (and PAD,
BOS, EOS pieces the model lacks) after the model's own pieces and cuts a text at those special
strings before encoding the parts; eod = `<EOD>`. A BPE model with byte fallback is encoded by
gigatoken when it gives sentencepiece's ids on the probe texts (GPT flavour only).
"""

from __future__ import annotations

import json
import re

import gigatoken
import numpy as np
import pyarrow as pa
import sentencepiece

from ..errors import TokenizerError
from .base import RaggedTokens, Tokenizer, as_large_strings
from .files import require_file
from .giga import GigatokenTokenizer, matches_reference, wrap_each

# Megatron's order of added special pieces; PAD/BOS/EOS fall back to these names when the model has none.
MEGATRON_SPECIAL_PIECES = ("<CLS>", "<SEP>", "<EOD>", "<MASK>")
FALLBACK_PIECES = {"pad": "<PAD>", "bos": "<BOS>", "eos": "<EOS>"}


def _load(model_file: str) -> sentencepiece.SentencePieceProcessor:
    require_file(model_file, "SentencePiece model")
    try:
        return sentencepiece.SentencePieceProcessor(model_file=model_file)
    except (RuntimeError, OSError) as error:
        raise TokenizerError(f"{model_file}: cannot read SentencePiece model: {error}") from None


def _piece_or(model: sentencepiece.SentencePieceProcessor, piece_id: int, default: str) -> str:
    return model.id_to_piece(piece_id) if 0 <= piece_id < model.get_piece_size() else default


def special_pieces(model: sentencepiece.SentencePieceProcessor) -> dict[str, int]:
    """Name -> id of a model's control (`<s>`, `</s>`, `<pad>`) and unknown pieces, which sentencepiece
    decodes to nothing or " ⁇ " rather than to their names. (User-defined pieces need nothing: sentencepiece
    itself encodes them from text and decodes them to their names.)"""
    return {model.id_to_piece(i): i for i in range(model.get_piece_size())
            if model.is_control(i) or model.is_unknown(i)}


class SentencePieceBase(Tokenizer):
    """A SentencePiece model encoded by the sentencepiece library (multi-threaded batch encode)."""

    def __init__(self, model: sentencepiece.SentencePieceProcessor) -> None:
        self.model = model
        self.special_tokens = special_pieces(model)

    def encode(self, text: str) -> list[int]:
        return self.model.encode_as_ids(text)

    def decode(self, ids) -> str:
        return self.model.decode_ids(np.asarray(ids).tolist())

    def encode_batch(self, texts: pa.Array | list[str]) -> RaggedTokens:
        return RaggedTokens.from_lists(self.model.encode(as_large_strings(texts).to_pylist(), out_type=int))


class GPTSentencePieceTokenizer(SentencePieceBase):
    """The model's own pieces and ids; eod = EOS, pad = PAD (None if the model has none)."""

    def __init__(self, model: sentencepiece.SentencePieceProcessor) -> None:
        super().__init__(model)
        self.vocab_size = model.get_piece_size()
        self._eod = model.eos_id() if model.eos_id() >= 0 else None
        self.pad = model.pad_id() if model.pad_id() >= 0 else None


class Llama2Tokenizer(GPTSentencePieceTokenizer):
    """Megatron's Llama2Tokenizer: the model's BOS before every text (`affixes`), nothing after it; eod = EOS."""

    def __init__(self, model: sentencepiece.SentencePieceProcessor, model_file: str) -> None:
        super().__init__(model)
        if model.bos_id() < 0:
            raise TokenizerError(f"{model_file}: the SentencePiece model defines no BOS piece, which "
                                 "Llama2Tokenizer puts before every text (use GPTSentencePieceTokenizer)")
        self.affixes = ((model.bos_id(),), ())

    def encode(self, text: str) -> list[int]:
        return [*self.affixes[0], *self.model.encode_as_ids(text)]

    def encode_plain(self, text: str) -> list[int]:
        return self.model.encode_as_ids(text)

    def encode_batch(self, texts: pa.Array | list[str]) -> RaggedTokens:
        return wrap_each(super().encode_batch(texts), np.array(self.affixes[0], np.int64), np.zeros(0, np.int64))


class MegatronSentencePieceTokenizer(SentencePieceBase):
    """Megatron's SentencePieceTokenizer: extra special pieces, texts cut at special strings."""

    def __init__(self, model: sentencepiece.SentencePieceProcessor) -> None:
        super().__init__(model)
        vocab = {model.id_to_piece(i): i for i in range(model.get_piece_size())}
        specials: dict[str, int] = {}

        def add(piece: str) -> int:
            specials[piece] = vocab.setdefault(piece, len(vocab))
            return specials[piece]

        for piece in MEGATRON_SPECIAL_PIECES:
            add(piece)
        self.pad = add(_piece_or(model, model.pad_id(), FALLBACK_PIECES["pad"]))
        add(_piece_or(model, model.bos_id(), FALLBACK_PIECES["bos"]))
        add(_piece_or(model, model.eos_id(), FALLBACK_PIECES["eos"]))
        self._eod = specials["<EOD>"]
        self.vocab_size = len(vocab)
        self.specials = specials
        self.special_tokens = {**self.special_tokens, **specials}
        self._inverse_specials = {i: piece for piece, i in specials.items()}
        # Leftmost match wins, ties go to the earlier-added piece: Megatron's `min(indices)` rule.
        self._special_pattern = re.compile("|".join(re.escape(piece) for piece in specials))

    def encode(self, text: str) -> list[int]:
        ids: list[int] = []
        start = 0
        for match in self._special_pattern.finditer(text):
            ids.extend(self.model.encode_as_ids(text[start : match.start()]))
            ids.append(self.specials[match.group()])
            start = match.end()
        ids.extend(self.model.encode_as_ids(text[start:]))
        return ids

    def decode(self, ids) -> str:
        parts, run = [], []
        for token in np.asarray(ids).tolist():
            if token in self._inverse_specials:
                parts += [self.model.decode_ids(run), self._inverse_specials[token]]
                run = []
            else:
                run.append(token)
        parts.append(self.model.decode_ids(run))
        return " ".join(part for part in parts if part)

    def encode_batch(self, texts: pa.Array | list[str]) -> RaggedTokens:
        return Tokenizer.encode_batch(self, texts)


def build_sentencepiece_tokenizer(model_file: str, megatron_specials: bool, bos: bool = False) -> Tokenizer:
    """SentencePieceTokenizer (`megatron_specials`), Llama2Tokenizer (`bos`) or GPTSentencePieceTokenizer.

    Raises:
        TokenizerError: the model file is missing or unreadable (or, with `bos`, has no BOS piece).
    """
    model = _load(model_file)
    if megatron_specials:
        return MegatronSentencePieceTokenizer(model)
    reference = Llama2Tokenizer(model, model_file) if bos else GPTSentencePieceTokenizer(model)
    backend = _gigatoken_backend(model_file)
    if backend is None or not matches_reference(backend, reference.encode_plain):
        return reference
    fast = GigatokenTokenizer(backend, reference.vocab_size, reference._eod, reference.pad, *reference.affixes)
    # What T5's sentinel convention reads (`preprocess.tokenizers.t5`), and the model's special pieces.
    fast.model, fast.special_tokens = model, reference.special_tokens
    return fast


def _gigatoken_backend(model_file: str) -> gigatoken.Tokenizer | None:
    """gigatoken's version of a BPE model, or None when gigatoken cannot load it.

    gigatoken registers `<s>`/`</s>` as special tokens matched inside the text (Hugging Face's habit);
    sentencepiece encodes such text literally, so the registration is dropped. The converter is
    gigatoken's private module, hence the broad fallback.
    """
    try:
        from gigatoken._load.sentencepiece import sentencepiece_to_tokenizer_json

        with open(model_file, "rb") as f:
            spec = json.loads(sentencepiece_to_tokenizer_json(f.read()))
        spec["added_tokens"] = []
        return gigatoken.Tokenizer.from_json(json.dumps(spec))
    except Exception:  # gigatoken implements BPE models with byte fallback only, and may move its converter
        return None
