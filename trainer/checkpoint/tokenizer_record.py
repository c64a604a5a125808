"""Which tokenizer a checkpoint records, and under which file names (read side; written by
`trainer.checkpoint.tokenizer`).

A checkpoint root holds its tokenizer's files under Hugging Face's names, and ``tokenizer_settings.json``
the Megatron tokenizer type they are read as (a WordPiece ``vocab.txt`` is cased or not, a SentencePiece
model is Megatron's T5 flavour or the plain one): ``{"tokenizer_type": "GPT2BPETokenizer", "vocab_size": null}``.

    recorded_tokenizer("runs/gpt-tiny")  # TokenizerConfig(tokenizer_type="GPT2BPETokenizer", vocab_file=...)
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from preprocess.tokenizers import TokenizerConfig
from trainer.errors import CheckpointError

# Hugging Face's tokenizer file names: GPT-2's, a tokenizer.json, T5/mT5's SentencePiece model, BERT's WordPiece.
GPT2_VOCAB, GPT2_MERGES, TOKENIZER_JSON = "vocab.json", "merges.txt", "tokenizer.json"
T5_SPIECE = "spiece.model"
LLAMA_SPM = "tokenizer.model"
"""Llama's (and Mistral's, Mixtral's) SentencePiece model, read as Megatron's Llama2Tokenizer."""
WORDPIECE_VOCAB = "vocab.txt"
SETTINGS_FILE = "tokenizer_settings.json"
# The file name each tokenizer file takes in a checkpoint, by tokenizer type and `TokenizerConfig` field.
STORED_NAMES: dict[str, dict[str, str]] = {
    "GPT2BPETokenizer": {"vocab_file": GPT2_VOCAB, "merge_file": GPT2_MERGES},
    "BertWordPieceLowerCase": {"vocab_file": WORDPIECE_VOCAB},
    "BertWordPieceCase": {"vocab_file": WORDPIECE_VOCAB},
    "SentencePieceTokenizer": {"tokenizer_model": T5_SPIECE},
    "GPTSentencePieceTokenizer": {"tokenizer_model": T5_SPIECE},
    "Llama2Tokenizer": {"tokenizer_model": LLAMA_SPM},
    "HuggingFaceTokenizer": {"tokenizer_model": TOKENIZER_JSON},
    "NullTokenizer": {},
}


def stored_config(root: Path, tokenizer_type: str, vocab_size: int | None = None) -> TokenizerConfig:
    """The `TokenizerConfig` of the files of ``tokenizer_type`` stored in ``root``."""
    files = {field: str(root / name) for field, name in STORED_NAMES[tokenizer_type].items()}
    return TokenizerConfig(tokenizer_type=tokenizer_type, vocab_size=vocab_size, **files)


def recorded_tokenizer(directory: str | os.PathLike) -> TokenizerConfig | None:
    """The tokenizer a checkpoint root records; None when it holds no record.

    Raises:
        CheckpointError: the record is unreadable or names a type we do not build.
    """
    path = Path(directory) / SETTINGS_FILE
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        kind = record["tokenizer_type"]
        if kind not in STORED_NAMES:
            raise ValueError(f"unknown tokenizer_type {kind!r}")
        return stored_config(Path(directory), kind, record.get("vocab_size"))
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise CheckpointError(f"{path}: not a tokenizer record ({type(error).__name__}: {error})") from None
