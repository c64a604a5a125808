"""A SentencePiece ``.model`` as a Hugging Face ``tokenizer.json``, giving sentencepiece's own ids.

transformers reads a bare ``.model`` only with protobuf installed (not one of our dependencies), so an
exported checkpoint carries a ``tokenizer.json`` built here with the `tokenizers` library: the model's pieces
and scores (Unigram), or its pieces with merges recovered from their scores (BPE: a piece's merge ranks by
the piece's score, as sentencepiece merges), and its normalizer settings read from the model file.

    write_spm_tokenizer_json("sp.model", "out/tokenizer.json")
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

import sentencepiece
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, processors

# ModelProto (sentencepiece_model.proto) fields read here: normalizer_spec = 3, trainer_spec = 2; in
# TrainerSpec model_type = 3 and byte_fallback = 35; in NormalizerSpec precompiled_charsmap = 2,
# add_dummy_prefix = 3, remove_extra_whitespaces = 4, escape_whitespaces = 5.
_TRAINER_SPEC, _NORMALIZER_SPEC = 2, 3
_MODEL_TYPE, _BYTE_FALLBACK = 3, 35
_CHARSMAP, _DUMMY_PREFIX, _EXTRA_WHITESPACES, _ESCAPE_WHITESPACES = 2, 3, 4, 5
# Protobuf wire types: varint, 64-bit, length-delimited, 32-bit.
_VARINT, _FIXED64, _BYTES, _FIXED32 = 0, 1, 2, 5
_UNIGRAM, _BPE = 1, 2
# SentencePiece's escaped space.
SPACE_PIECE = "\u2581"


@dataclass(frozen=True, slots=True)
class _Settings:
    """What `tokenizers` needs beyond the pieces (sentencepiece's defaults where the file is silent)."""

    model_type: int = _UNIGRAM
    byte_fallback: bool = False
    charsmap: bytes = b""
    add_dummy_prefix: bool = True
    remove_extra_whitespaces: bool = True
    escape_whitespaces: bool = True


def _fields(data: bytes) -> dict[int, list[int | bytes]]:
    """Field number -> values of one protobuf message (varints as ints, length-delimited as bytes)."""
    fields: dict[int, list[int | bytes]] = {}
    position = 0

    def varint() -> int:
        nonlocal position
        value, shift = 0, 0
        while True:
            byte = data[position]
            position += 1
            value |= (byte & 0x7F) << shift
            shift += 7
            if byte < 0x80:
                return value

    while position < len(data):
        key = varint()
        number, wire = key >> 3, key & 7
        if wire == _VARINT:
            value: int | bytes = varint()
        elif wire == _BYTES:
            length = varint()
            value, position = data[position:position + length], position + length
        else:
            width = 8 if wire == _FIXED64 else 4 if wire == _FIXED32 else None
            if width is None:
                raise ValueError(f"unsupported protobuf wire type {wire}")
            value, position = data[position:position + width], position + width
        fields.setdefault(number, []).append(value)
    return fields


def _settings(model: sentencepiece.SentencePieceProcessor) -> _Settings:
    proto = _fields(model.serialized_model_proto())
    trainer = _fields(proto[_TRAINER_SPEC][0]) if _TRAINER_SPEC in proto else {}
    normalizer = _fields(proto[_NORMALIZER_SPEC][0]) if _NORMALIZER_SPEC in proto else {}
    defaults = _Settings()

    def flag(fields: dict, number: int, default: bool) -> bool:
        return bool(fields[number][-1]) if number in fields else default

    return _Settings(model_type=trainer.get(_MODEL_TYPE, [defaults.model_type])[-1],
                     byte_fallback=flag(trainer, _BYTE_FALLBACK, defaults.byte_fallback),
                     charsmap=normalizer.get(_CHARSMAP, [b""])[-1],
                     add_dummy_prefix=flag(normalizer, _DUMMY_PREFIX, defaults.add_dummy_prefix),
                     remove_extra_whitespaces=flag(normalizer, _EXTRA_WHITESPACES, defaults.remove_extra_whitespaces),
                     escape_whitespaces=flag(normalizer, _ESCAPE_WHITESPACES, defaults.escape_whitespaces))


def _bpe_merges(pieces: list[tuple[str, float]]) -> list[tuple[str, str]]:
    """Every split of a piece into two pieces of the vocabulary, ranked by the merged piece's score
    (then by its id), as sentencepiece's BPE applies them."""
    ids = {piece: i for i, (piece, _) in enumerate(pieces)}
    ranked = []
    for piece, score in pieces:
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in ids and right in ids:
                ranked.append((-score, ids[piece], ids[left], ids[right], left, right))
    return [(left, right) for *_, left, right in sorted(ranked)]


def spm_tokenizer(model_file: str | os.PathLike, special_tokens: Mapping[str, int] = MappingProxyType({}),
                  prefix: tuple[int, ...] = ()) -> Tokenizer:
    """The `tokenizers` twin of a SentencePiece model: same ids as ``encode_as_ids``.

    Args:
        model_file: the ``.model`` file.
        special_tokens: name -> id of the tokenizer's special tokens; those past the model's pieces (Megatron's
            SentencePieceTokenizer appends ``<CLS>``, ``<SEP>``, ``<EOD>``, ...) are added in id order, so that
            they keep their ids and are cut out of a text before it is encoded, as that tokenizer does.
        prefix: ids put before every text (Llama2Tokenizer's BOS), by a post-processor, so that
            ``add_special_tokens=True`` (transformers' default) gives the tokenizer's ids.

    Raises:
        ValueError: a model type other than Unigram or BPE (word/char models are not converted).
    """
    model = sentencepiece.SentencePieceProcessor(model_file=str(model_file))
    settings = _settings(model)
    pieces = [(model.id_to_piece(i), model.get_score(i)) for i in range(model.get_piece_size())]
    unk = model.unk_id()
    if settings.model_type == _UNIGRAM:
        backend = models.Unigram(pieces, unk_id=unk, byte_fallback=settings.byte_fallback)
    elif settings.model_type == _BPE:
        backend = models.BPE({piece: i for i, (piece, _) in enumerate(pieces)}, _bpe_merges(pieces),
                             unk_token=pieces[unk][0], byte_fallback=settings.byte_fallback, fuse_unk=True)
    else:
        raise ValueError(f"{model_file}: SentencePiece model type {settings.model_type} has no tokenizer.json form "
                         "(Unigram and BPE do)")
    tokenizer = Tokenizer(backend)
    steps = [normalizers.Precompiled(settings.charsmap)] if settings.charsmap else []
    if settings.remove_extra_whitespaces:
        steps += [normalizers.Strip(), normalizers.Replace(Regex(" {2,}"), " ")]
    if settings.add_dummy_prefix:
        steps.append(normalizers.Prepend(" "))
    if settings.escape_whitespaces:
        steps.append(normalizers.Replace(" ", SPACE_PIECE))
    if steps:
        tokenizer.normalizer = normalizers.Sequence(steps)
    tokenizer.decoder = decoders.Sequence([decoders.Replace(SPACE_PIECE, " "), decoders.ByteFallback(), decoders.Fuse(),
                                           decoders.Strip(" ", 1 if settings.add_dummy_prefix else 0, 0)])
    # Control pieces (<s>, </s>) stay out of the added tokens: sentencepiece never reads them from text.
    appended = sorted((token_id, name) for name, token_id in special_tokens.items() if token_id >= len(pieces))
    for expected, (token_id, name) in enumerate(appended, start=len(pieces)):
        if token_id != expected:
            raise ValueError(f"{model_file}: special token {name!r} has id {token_id}, expected {expected}")
        tokenizer.add_special_tokens([name])
    if prefix:
        pieces_of = [(pieces[token_id][0], token_id) for token_id in prefix]
        template = " ".join(piece for piece, _ in pieces_of)
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{template} $A", pair=f"{template} $A {template} $B:1", special_tokens=sorted(set(pieces_of)))
    return tokenizer


def write_spm_tokenizer_json(model_file: str | os.PathLike, path: str | os.PathLike,
                             special_tokens: Mapping[str, int] = MappingProxyType({}),
                             prefix: tuple[int, ...] = ()) -> None:
    """Write the `spm_tokenizer` of ``model_file`` to ``path`` (the caller renames it into place)."""
    spm_tokenizer(model_file, special_tokens, prefix).save(str(path))
