"""`TokenizerConfig`: which tokenizer to build, with Megatron's option names."""

from __future__ import annotations

import argparse
import dataclasses
import os
from dataclasses import dataclass

# The tokenizer types we build; each names the option fields it reads (every other option must stay
# unset, so that a flag that is accepted always has an effect).
TOKENIZER_OPTIONS: dict[str, tuple[str, ...]] = {
    "GPT2BPETokenizer": ("vocab_file", "merge_file"),
    "BertWordPieceLowerCase": ("vocab_file",),
    "BertWordPieceCase": ("vocab_file",),
    "SentencePieceTokenizer": ("tokenizer_model",),
    "GPTSentencePieceTokenizer": ("tokenizer_model",),
    "Llama2Tokenizer": ("tokenizer_model",),
    "HuggingFaceTokenizer": ("tokenizer_model",),
    "NullTokenizer": ("vocab_size",),
}
TOKENIZER_TYPES = tuple(TOKENIZER_OPTIONS)
BERT_TOKENIZER_TYPES = ("BertWordPieceLowerCase", "BertWordPieceCase")
_OPTION_FIELDS = ("vocab_file", "merge_file", "tokenizer_model", "vocab_size")
TOKENIZER_FILE_FIELDS = ("tokenizer_type", "vocab_file", "merge_file", "tokenizer_model")
"""The fields that name a tokenizer and its files: one unit (a model directory's tokenizer is used whole
or not at all)."""


@dataclass(kw_only=True, slots=True, frozen=True)
class TokenizerConfig:
    """How to build a tokenizer; field names follow Megatron's `--tokenizer-*` flags."""

    tokenizer_type: str
    """One of TOKENIZER_TYPES."""
    vocab_file: str | None = None
    """GPT-2 vocab.json, or a BERT WordPiece vocab.txt."""
    merge_file: str | None = None
    """GPT-2 merges.txt."""
    tokenizer_model: str | None = None
    """A SentencePiece .model, or a Hugging Face tokenizer.json or directory holding one (local only)."""
    vocab_size: int | None = None
    """NullTokenizer's vocabulary size; its eod id is vocab_size - 1."""
    tokenizer_hf_include_special_tokens: bool = True
    """HuggingFaceTokenizer: add the tokenizer's own special tokens (e.g. BOS), as Megatron does.
    Also accepted (as False) with the BERT tokenizers, which add none unless asked (next field)."""
    tokenizer_bert_include_special_tokens: bool = False
    """BertWordPieceLowerCase/Case: wrap every text in [CLS] ... [SEP], reproducing the bytes of Megatron
    HEAD (megatron-core tokenizers). Off by default: Megatron's BertDataset/T5Dataset add them again."""
    chinese_wwm: bool = False
    """BertWordPieceLowerCase/Case: write the characters that continue a Chinese word (jieba, words of up to
    3 characters) as their `##X` pieces, LiBai's `--do-chinese-wwm`, so whole-word masking sees the words."""

    def __post_init__(self) -> None:
        required = TOKENIZER_OPTIONS.get(self.tokenizer_type)
        if required is None:
            raise ValueError(f"tokenizer_type {self.tokenizer_type!r} is not one of {', '.join(TOKENIZER_TYPES)}")
        missing = [name for name in required if getattr(self, name) is None]
        if missing:  # all of them at once: a user fixing one at a time would run again for each
            raise ValueError(f"{self.tokenizer_type} needs {' and '.join(missing)}")
        for name in _OPTION_FIELDS:
            value = getattr(self, name)
            if name not in required and value is not None:
                raise ValueError(f"{name} is not used by {self.tokenizer_type}")
        bert = self.tokenizer_type in BERT_TOKENIZER_TYPES
        if not self.tokenizer_hf_include_special_tokens and not (bert or self.tokenizer_type == "HuggingFaceTokenizer"):
            raise ValueError("tokenizer_hf_include_special_tokens=False only applies to HuggingFaceTokenizer and "
                             f"{' and '.join(BERT_TOKENIZER_TYPES)}")
        if self.tokenizer_bert_include_special_tokens and not bert:
            raise ValueError(f"tokenizer_bert_include_special_tokens only applies to {' and '.join(BERT_TOKENIZER_TYPES)}")
        if self.chinese_wwm and not bert:
            raise ValueError(f"chinese_wwm (--do-chinese-wwm) only applies to the WordPiece tokenizers "
                             f"({', '.join(BERT_TOKENIZER_TYPES)}; LiBai's BertTokenizer), not {self.tokenizer_type}")
        if self.tokenizer_bert_include_special_tokens and not self.tokenizer_hf_include_special_tokens:
            raise ValueError("tokenizer_bert_include_special_tokens contradicts tokenizer_hf_include_special_tokens=False")
        if self.vocab_size is not None and self.vocab_size < 1:
            raise ValueError(f"vocab_size must be >= 1, got {self.vocab_size}")

    def files(self) -> list[str]:
        """The files the tokenizer is read from (vocabulary, merges, model file; not a model folder or
        hub name): what no output of the same command may overwrite."""
        return [path for path in (self.vocab_file, self.merge_file, self.tokenizer_model)
                if path and os.path.isfile(path)]


def dataclass_from_args(cls, args: argparse.Namespace, **overrides):
    """An instance of dataclass `cls` from the parsed flags whose names match its fields, plus overrides."""
    values = {field.name: getattr(args, field.name) for field in dataclasses.fields(cls) if hasattr(args, field.name)}
    return cls(**{**values, **overrides})
