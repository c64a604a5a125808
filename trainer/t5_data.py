"""What T5 training needs from the tokenizer and the samplers: special ids, datasets, micro-batches.

    special = t5_special_ids(tokenizer, tokenizer_type="GPTSentencePieceTokenizer", vocab_extra_ids=100)
    train, valid, test = build_t5_datasets(T5DatasetConfig(data_prefix=..., sentinel_ids=special.sentinels,
                                           pad_id=special.pad, decoder_start_id=special.decoder_start,
                                           eos_id=special.eos), sizes)
    batch = collate_t5([train[i] for i in indices], vocab_size=special.vocab_size)

Sentinel ids (`<extra_id_k>`) follow the convention of the tokenizer's ecosystem:
- a SentencePiece model that holds `<extra_id_k>` pieces: those pieces;
- a plain SentencePiece model (GPTSentencePieceTokenizer; Hugging Face T5/mT5 `spiece.model`):
  Hugging Face's, appended after the model in reverse order, `<extra_id_k>` = size + N - 1 - k; pad
  and EOS are the model's own, and the decoder starts with the pad id;
- Megatron's tokenizers with `vocab_extra_ids N` (SentencePieceTokenizer, BertWordPiece*): appended
  in order after the tokenizer's own and Megatron's added tokens; BertWordPiece also gets Megatron's
  `[BOS]`/`[EOS]` (appended unless in the vocabulary), and the decoder starts with BOS.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from trainer.data import IGNORE_INDEX
from trainer.errors import TrainConfigError

if TYPE_CHECKING:  # the tokenizer libraries load only when a run builds a tokenizer
    from preprocess.tokenizers import Tokenizer

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
        raise TrainConfigError("T5 needs a SentencePiece model with pad and EOS pieces (Hugging Face T5/mT5 models "
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
        TrainConfigError: the tokenizer kind has no T5 convention, or it lacks pad/EOS.
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
        ids = {}
        for piece in (MEGATRON_BOS, MEGATRON_EOS):
            ids[piece] = backend.token_to_id(piece)
            if ids[piece] is None:
                ids[piece], next_id = next_id, next_id + 1
        return T5SpecialIds(vocab_size=next_id + vocab_extra_ids, pad=tokenizer.pad, eos=ids[MEGATRON_EOS],
                            decoder_start=ids[MEGATRON_BOS],
                            sentinels=tuple(next_id + k for k in range(vocab_extra_ids)))
    raise TrainConfigError(f"T5 needs a SentencePiece or WordPiece tokenizer, not {tokenizer_type}")


@dataclass(slots=True)
class T5MicroBatch:
    """One micro-batch: int64 [batch, Le] encoder ids and mask, int64 [batch, Ld] decoder ids and targets."""

    encoder_input_ids: torch.Tensor
    decoder_input_ids: torch.Tensor
    encoder_attention_mask: torch.Tensor
    targets: torch.Tensor
    """Labels with IGNORE_INDEX where the loss mask is 0."""

    def to(self, device: torch.device) -> T5MicroBatch:
        return T5MicroBatch(*(t.to(device, non_blocking=True) for t in (
            self.encoder_input_ids, self.decoder_input_ids, self.encoder_attention_mask, self.targets)))

    @property
    def num_target_tokens(self) -> int:
        return int((self.targets != IGNORE_INDEX).sum())


def collate_t5(items: list[dict[str, torch.Tensor]], vocab_size: int) -> T5MicroBatch:
    """Stack `samplers.t5_dataset.T5Dataset` items into a micro-batch.

    Raises:
        TrainConfigError: a token id does not fit the model's vocabulary.
    """
    stack = {key: torch.stack([item[key] for item in items]) for key in items[0]}
    largest = int(max(stack["encoder_input_ids"].max(), stack["labels"].max()))
    if largest >= vocab_size:
        raise TrainConfigError(f"the data holds token id {largest} but vocab_size is {vocab_size}")
    return T5MicroBatch(encoder_input_ids=stack["encoder_input_ids"], decoder_input_ids=stack["decoder_input_ids"],
                        encoder_attention_mask=stack["encoder_attention_mask"],
                        targets=stack["labels"].masked_fill(stack["loss_mask"] == 0, IGNORE_INDEX))
