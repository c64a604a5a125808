"""T5's special token ids for a tokenizer: pad, EOS, decoder start and the sentinels `<extra_id_k>`.

    special = t5_special_ids(tokenizer, tokenizer_type="GPTSentencePieceTokenizer", vocab_extra_ids=100)
    special.sentinels[0]  # id of <extra_id_0>

Sentinel ids (`<extra_id_k>`) follow the convention of the tokenizer's ecosystem:
- a SentencePiece model that holds `<extra_id_k>` pieces: those pieces;
- a plain SentencePiece model (GPTSentencePieceTokenizer; Hugging Face T5/mT5 `spiece.model`):
  Hugging Face's, appended after the model in reverse order, `<extra_id_k>` = size + N - 1 - k; pad
  and EOS are the model's own, and the decoder starts with the pad id;
- Megatron's tokenizers with `vocab_extra_ids N` (SentencePieceTokenizer, BertWordPiece*): appended
  in order after the tokenizer's own and Megatron's added tokens; BertWordPiece also gets Megatron's
  `[BOS]`/`[EOS]` (appended unless in the vocabulary), and the decoder starts with BOS;
- a Hugging Face tokenizer.json: its own `<extra_id_k>` tokens, else appended in order; its pad and eos.

`t5_text_tokenizer` wraps the tokenizer so that prompts and generated ids read and write the sentinels
and every special token by name (`<extra_id_0>` in a prompt is the sentinel's id, not pieces of it).

It needs only a tokenizer, so both ``train --model t5`` and ``inspect-index`` use it.
"""

from __future__ import annotations

from dataclasses import dataclass

from preprocess.errors import TokenizerError

from .base import Tokenizer
from .specials import SpecialTokenText, with_special_tokens

SENTINEL_PIECE = "<extra_id_{}>"
MEGATRON_BOS, MEGATRON_EOS = "[BOS]", "[EOS]"


@dataclass(frozen=True, slots=True)
class T5SpecialIds:
    """Token ids T5 span corruption and generation use."""

    vocab_size: int
    """Ids are < vocab_size (the tokenizer's own plus added tokens); pad the model's vocabulary from it."""
    pad: int
    eos: int
    decoder_start: int
    sentinels: tuple[int, ...]
    """Id of `<extra_id_k>` at position k."""
    appended: tuple[tuple[str, int], ...] = ()
    """(name, id) of the other tokens appended after the tokenizer's vocabulary (Megatron's [BOS]/[EOS])."""

    def token_names(self) -> dict[str, int]:
        """Name -> id of the sentinels and the other appended tokens."""
        return {**dict(self.appended), **{SENTINEL_PIECE.format(k): i for k, i in enumerate(self.sentinels)}}


def t5_text_tokenizer(tokenizer: Tokenizer, special: T5SpecialIds) -> SpecialTokenText:
    """``tokenizer`` reading and writing T5's sentinels (`<extra_id_k>`) and every special token by name:
    what prompts and generated ids of a T5 go through."""
    return with_special_tokens(tokenizer, special.token_names())


def _sentencepiece_ids(tokenizer: Tokenizer, vocab_extra_ids: int) -> T5SpecialIds:
    model = tokenizer.model
    size = model.get_piece_size()
    own = [i for i in range(size) if model.id_to_piece(i).startswith("<extra_id_")]
    if own:
        by_number = {model.id_to_piece(i): i for i in own}
        sentinels = tuple(by_number[SENTINEL_PIECE.format(k)] for k in range(len(own)))
        added = 0
    else:
        sentinels = tuple(size + vocab_extra_ids - 1 - k for k in range(vocab_extra_ids))
        added = vocab_extra_ids
    if model.pad_id() < 0 or model.eos_id() < 0:
        raise TokenizerError("T5 needs a SentencePiece model with pad and EOS pieces (Hugging Face T5/mT5 models "
                               "have them); use tokenizer_type SentencePieceTokenizer to add Megatron's")
    return T5SpecialIds(vocab_size=size + added, pad=model.pad_id(), eos=model.eos_id(),
                        decoder_start=model.pad_id(), sentinels=sentinels)


def _megatron_piece_id(tokenizer: Tokenizer, model_id: int, fallback: str) -> int:
    """Id of the model's BOS/EOS piece in Megatron's SentencePieceTokenizer (its fallback piece if absent)."""
    piece = tokenizer.model.id_to_piece(model_id) if model_id >= 0 else fallback
    return tokenizer.specials[piece]


def t5_special_ids(tokenizer: Tokenizer, tokenizer_type: str, vocab_extra_ids: int) -> T5SpecialIds:
    """Pad, EOS, decoder start and sentinel ids for T5 with this tokenizer.

    Args:
        tokenizer: the built tokenizer (`preprocess.tokenizers.build_tokenizer`).
        tokenizer_type: its Megatron type name.
        vocab_extra_ids: sentinels to add when the vocabulary has none (Megatron's --vocab-extra-ids).

    Raises:
        TokenizerError: the tokenizer kind has no T5 convention, or it lacks pad/EOS.
    """
    if tokenizer_type == "GPTSentencePieceTokenizer":
        return _sentencepiece_ids(tokenizer, vocab_extra_ids)
    if tokenizer_type == "SentencePieceTokenizer":
        size = tokenizer.vocab_size
        return T5SpecialIds(vocab_size=size + vocab_extra_ids, pad=tokenizer.pad,
                            eos=_megatron_piece_id(tokenizer, tokenizer.model.eos_id(), "<EOS>"),
                            decoder_start=_megatron_piece_id(tokenizer, tokenizer.model.bos_id(), "<BOS>"),
                            sentinels=tuple(size + k for k in range(vocab_extra_ids)))
    if tokenizer_type in ("BertWordPieceLowerCase", "BertWordPieceCase"):
        backend = tokenizer.backend
        next_id = tokenizer.vocab_size
        ids, appended = {}, []
        for piece in (MEGATRON_BOS, MEGATRON_EOS):
            ids[piece] = backend.token_to_id(piece)
            if ids[piece] is None:
                ids[piece], next_id = next_id, next_id + 1
                appended.append((piece, ids[piece]))
        return T5SpecialIds(vocab_size=next_id + vocab_extra_ids, pad=tokenizer.pad, eos=ids[MEGATRON_EOS],
                            decoder_start=ids[MEGATRON_BOS],
                            sentinels=tuple(next_id + k for k in range(vocab_extra_ids)), appended=tuple(appended))
    if tokenizer_type == "HuggingFaceTokenizer":
        return _huggingface_ids(tokenizer, vocab_extra_ids)
    raise TokenizerError(f"T5 needs a SentencePiece or WordPiece tokenizer (or a Hugging Face tokenizer.json), not {tokenizer_type}")


def _huggingface_ids(tokenizer: Tokenizer, vocab_extra_ids: int) -> T5SpecialIds:
    """A tokenizer.json's own `<extra_id_k>` tokens (T5TokenizerFast writes them), else sentinels appended
    in order; pad and EOS are the tokenizer's, and the decoder starts with pad (Hugging Face's T5)."""
    if tokenizer.pad is None:
        raise TokenizerError("T5 needs a tokenizer with a pad token (pad_token in tokenizer_config.json)")
    own = tokenizer.special_tokens
    count = sum(1 for name in own if name.startswith("<extra_id_"))
    if count:
        sentinels, size = tuple(own[SENTINEL_PIECE.format(k)] for k in range(count)), tokenizer.vocab_size
    else:
        sentinels = tuple(tokenizer.vocab_size + k for k in range(vocab_extra_ids))
        size = tokenizer.vocab_size + vocab_extra_ids
    return T5SpecialIds(vocab_size=size, pad=tokenizer.pad, eos=tokenizer.eod, decoder_start=tokenizer.pad,
                        sentinels=sentinels)
