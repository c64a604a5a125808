"""The tokenizer a checkpoint was trained with, kept beside its ``model_config.json``.

At save, `record_tokenizer` copies the run's tokenizer files into the checkpoint root under Hugging Face's
names, writes their Hugging Face description (``tokenizer_config.json``, ``special_tokens_map.json``, and a
``tokenizer.json`` for a SentencePiece model, `trainer.checkpoint.spm_to_hf`) and records the tokenizer type in
``tokenizer_settings.json``. Every command that loads the checkpoint reads it back with
`trainer.checkpoint.tokenizer_record.recorded_tokenizer` (through
`trainer.checkpoint.hf_files.tokenizer_config_for_directory`), and ``convert-checkpoint --to-hf`` copies the
files, so ``transformers.AutoTokenizer.from_pretrained(export)`` gives our ids.

    Layout (GPT-2 files)          WordPiece        SentencePiece                  tokenizer.json
    vocab.json, merges.txt        vocab.txt        spiece.model, tokenizer.json   tokenizer.json
    + tokenizer_config.json, special_tokens_map.json, tokenizer_settings.json
    (every kind; NullTokenizer: tokenizer_settings.json only)

BERT's WordPiece is described as transformers' BertTokenizer, which (as BERT expects) wraps a text in
[CLS] ... [SEP]; ``add_special_tokens=False`` gives the ids of Megatron's BertWordPiece tokenizers.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from preprocess.tokenizers import TokenizerConfig, build_tokenizer
from trainer.checkpoint.hf_files import replace_atomically, write_json
from trainer.checkpoint.spm_to_hf import write_spm_tokenizer_json
from trainer.checkpoint.tokenizer_record import SETTINGS_FILE, STORED_NAMES, TOKENIZER_JSON, stored_config

HF_TOKENIZER_CONFIG = "tokenizer_config.json"
HF_SPECIAL_TOKENS_MAP = "special_tokens_map.json"
GPT2_END_OF_TEXT = "<|endoftext|>"
# BERT's special tokens, by transformers' names.
BERT_SPECIAL_TOKENS = {"unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]", "cls_token": "[CLS]",
                       "mask_token": "[MASK]"}
# transformers' name of each special token our tokenizers expose (eod -> eos), as `Tokenizer` attributes
# that are None when the tokenizer has no such token.
_SPECIAL_ROLES = (("eos_token", "_eod"), ("pad_token", "pad"))


def record_tokenizer(root: str | os.PathLike, tokenizer: TokenizerConfig) -> None:
    """Store ``tokenizer`` (its files, their Hugging Face description and its type) in checkpoint root ``root``
    (call on one rank). Each file is written under a temporary name first.

    Raises:
        TokenizerError: a tokenizer file cannot be read.
    """
    root = Path(root)
    for field, name in STORED_NAMES[tokenizer.tokenizer_type].items():
        source = Path(getattr(tokenizer, field))
        if field == "tokenizer_model" and source.is_dir():  # a HF directory holding its tokenizer.json
            source = source / TOKENIZER_JSON
        _copy(source, root / name)
    stored = stored_config(root, tokenizer.tokenizer_type, tokenizer.vocab_size)
    _write_hf_description(root, tokenizer, stored)
    write_json(root / SETTINGS_FILE, {"tokenizer_type": tokenizer.tokenizer_type, "vocab_size": tokenizer.vocab_size})


def run_tokenizer(tokenizer_type: str, files: dict[str, str | None], vocab_size: int) -> TokenizerConfig | None:
    """The tokenizer a training run names: its type and files (``vocab_file``, ``merge_file``,
    ``tokenizer_model``), or NullTokenizer with the model's vocabulary size; None for a run that gives a
    vocabulary size and no tokenizer files (nothing to record)."""
    given = {field: path for field, path in files.items() if path is not None}
    if tokenizer_type == "NullTokenizer":
        return TokenizerConfig(tokenizer_type=tokenizer_type, vocab_size=vocab_size)
    return TokenizerConfig(tokenizer_type=tokenizer_type, **given) if given else None


def _copy(source: Path, destination: Path) -> None:
    if source.resolve() == destination.resolve():  # resuming into the same root
        return
    replace_atomically(destination, lambda temp: shutil.copyfile(source, temp))


def _write_hf_description(root: Path, tokenizer: TokenizerConfig, stored: TokenizerConfig) -> None:
    """``tokenizer_config.json`` and ``special_tokens_map.json`` (and SentencePiece's ``tokenizer.json``)."""
    kind = tokenizer.tokenizer_type
    if kind == "NullTokenizer":
        return  # ids written as text: transformers has no such tokenizer
    # Built from the user's files: a tokenizer.json's eos is named by the config files beside it.
    built = build_tokenizer(tokenizer)
    names = {token_id: name for name, token_id in built.special_tokens.items()}
    tokens = {role: names[getattr(built, attribute)] for role, attribute in _SPECIAL_ROLES
              if getattr(built, attribute) in names}
    if kind == "HuggingFaceTokenizer":
        _copy_hf_configs(tokenizer, root, tokens)
        return
    if kind == "GPT2BPETokenizer":
        config: dict[str, Any] = {"tokenizer_class": "GPT2Tokenizer", "add_prefix_space": False,
                                  "bos_token": GPT2_END_OF_TEXT, "eos_token": GPT2_END_OF_TEXT,
                                  "unk_token": GPT2_END_OF_TEXT}
    elif kind in ("BertWordPieceLowerCase", "BertWordPieceCase"):
        config = {"tokenizer_class": "BertTokenizer", "do_lower_case": kind == "BertWordPieceLowerCase",
                  **BERT_SPECIAL_TOKENS}
    else:  # SentencePiece: a tokenizer.json transformers reads without protobuf
        prefix = built.affixes[0]  # Llama2Tokenizer's BOS
        replace_atomically(root / TOKENIZER_JSON, lambda temp: write_spm_tokenizer_json(
            stored.tokenizer_model, temp, built.special_tokens, prefix))
        config = {"tokenizer_class": "PreTrainedTokenizerFast", **tokens,
                  **({"bos_token": names[prefix[0]]} if prefix else {})}
    write_json(root / HF_SPECIAL_TOKENS_MAP, {key: value for key, value in config.items() if key.endswith("_token")})
    write_json(root / HF_TOKENIZER_CONFIG, config)


def _copy_hf_configs(tokenizer: TokenizerConfig, root: Path, tokens: dict[str, str]) -> None:
    """A tokenizer.json's own config files (they name its eos token), completed with a ``tokenizer_class``
    (so that transformers reads it without a model ``config.json``) and the special ``tokens`` we found in
    the tokenizer.json itself (role -> token) where they name none."""
    model = Path(tokenizer.tokenizer_model)
    directory = model if model.is_dir() else model.parent
    configs = {}
    for name in (HF_SPECIAL_TOKENS_MAP, HF_TOKENIZER_CONFIG):
        path = directory / name
        configs[name] = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    config = {"tokenizer_class": "PreTrainedTokenizerFast", **tokens, **configs[HF_TOKENIZER_CONFIG]}
    special = {**{key: value for key, value in config.items() if key.endswith("_token")},
               **configs[HF_SPECIAL_TOKENS_MAP]}
    write_json(root / HF_SPECIAL_TOKENS_MAP, special)
    write_json(root / HF_TOKENIZER_CONFIG, config)
