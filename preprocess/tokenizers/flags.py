"""The tokenizer flags, defined once for every CLI that builds a tokenizer (Megatron's names)."""

from __future__ import annotations

import argparse

from .config import TOKENIZER_TYPES, TokenizerConfig, dataclass_from_args


def add_tokenizer_arguments(parser: argparse.ArgumentParser, required: bool = True) -> None:
    """Add `--tokenizer-type`, `--vocab-file` (alias `--vocab`), `--merge-file`, `--tokenizer-model`,
    `--vocab-size`, `--tokenizer-hf-no-include-special-tokens` and `--tokenizer-bert-include-special-tokens`
    to `parser`."""
    group = parser.add_argument_group("tokenizer")
    group.add_argument("--tokenizer-type", choices=TOKENIZER_TYPES, required=required, help="tokenizer kind")
    group.add_argument("--vocab-file", "--vocab", dest="vocab_file", help="GPT-2 vocab.json or BERT vocab.txt")
    group.add_argument("--merge-file", help="GPT-2 merges.txt")
    group.add_argument("--tokenizer-model", help="SentencePiece .model, or local tokenizer.json / its directory")
    group.add_argument("--vocab-size", type=int, help="NullTokenizer vocabulary size (eod = vocab size - 1)")
    group.add_argument(
        "--tokenizer-hf-no-include-special-tokens",
        dest="tokenizer_hf_include_special_tokens",
        action="store_false",
        help="HuggingFaceTokenizer: do not add the tokenizer's special tokens (e.g. BOS) to every text; "
             "BertWordPiece*: accepted, and already the default (no [CLS]/[SEP])",
    )
    group.add_argument(
        "--tokenizer-bert-include-special-tokens",
        action="store_true",
        help="BertWordPiece*: wrap every document (every sentence with --split-sentences) in [CLS] ... [SEP], "
             "the bytes of Megatron HEAD's megatron-core tokenizers (default: no wrapping, as Megatron's "
             "BertDataset/T5Dataset add them themselves)",
    )


def tokenizer_config_from_args(args: argparse.Namespace) -> TokenizerConfig | None:
    """The TokenizerConfig of parsed flags, or None when no `--tokenizer-type` was given.

    Raises:
        ValueError: the flags do not fit the tokenizer type.
    """
    if args.tokenizer_type is None:
        return None
    return dataclass_from_args(TokenizerConfig, args)
