"""The tokenizer flags, defined once for every CLI that builds a tokenizer (Megatron's names).

LiBai's `tools/preprocess_data.py` spelling is accepted too and mapped onto ours:
`--tokenizer-name BertTokenizer [--do-lower-case]` is `--tokenizer-type BertWordPieceLowerCase` (else
`BertWordPieceCase`), `GPT2Tokenizer` is `GPT2BPETokenizer`, `T5Tokenizer` (its `--vocab-file` is the
SentencePiece model) is `GPTSentencePieceTokenizer`; `--merges-file` is `--merge-file`.
"""

from __future__ import annotations

import argparse
import re

from .config import TOKENIZER_TYPES, TokenizerConfig, dataclass_from_args

# LiBai's --tokenizer-name -> our --tokenizer-type (BertTokenizer: see `_libai_tokenizer_type`).
LIBAI_TOKENIZER_TYPES = {
    "BertTokenizer": "BertWordPieceCase",
    "GPT2Tokenizer": "GPT2BPETokenizer",
    "T5Tokenizer": "GPTSentencePieceTokenizer",
}
# LiBai names with no tokenmill equivalent, and what to use instead.
LIBAI_UNSUPPORTED = {
    "RobertaTokenizer": "its byte-level BPE uses <s>/</s>, which GPT2BPETokenizer does not; give its "
                        "tokenizer.json with --tokenizer-type HuggingFaceTokenizer --tokenizer-model",
}


# `TokenizerConfig` field -> the flag that sets it, so that its errors name what the user types.
FIELD_FLAGS = {"vocab_file": "--vocab-file", "merge_file": "--merge-file", "tokenizer_model": "--tokenizer-model",
               "vocab_size": "--vocab-size", "chinese_wwm": "--do-chinese-wwm",
               "tokenizer_bert_include_special_tokens": "--tokenizer-bert-include-special-tokens",
               "tokenizer_type": "--tokenizer-type"}
_FIELD_NAMES = re.compile(r"(?<![\w-])(" + "|".join(FIELD_FLAGS) + r")(?![\w-])")


def add_tokenizer_arguments(parser: argparse.ArgumentParser, required: bool = True, preprocessing: bool = True) -> None:
    """Add `--tokenizer-type` (or LiBai's `--tokenizer-name` with `--do-lower-case`), `--do-chinese-wwm`,
    `--vocab-file` (alias `--vocab`), `--merge-file` (alias `--merges-file`), `--tokenizer-model`,
    `--vocab-size`, `--tokenizer-hf-no-include-special-tokens` and `--tokenizer-bert-include-special-tokens`
    to `parser`. Without ``preprocessing`` (commands that read a model's text, not a corpus), the two flags
    that only shape a corpus's ids (`--do-chinese-wwm`, `--tokenizer-bert-include-special-tokens`) are left out."""
    group = parser.add_argument_group("tokenizer")
    kind = group.add_mutually_exclusive_group(required=required)
    kind.add_argument("--tokenizer-type", choices=TOKENIZER_TYPES, help="tokenizer kind")
    kind.add_argument("--tokenizer-name", choices=(*LIBAI_TOKENIZER_TYPES, *LIBAI_UNSUPPORTED),
                      help="LiBai's spelling: BertTokenizer (BertWordPieceLowerCase with --do-lower-case, else "
                           "BertWordPieceCase), GPT2Tokenizer (GPT2BPETokenizer), T5Tokenizer "
                           "(GPTSentencePieceTokenizer; --vocab-file is its SentencePiece model)")
    group.add_argument("--do-lower-case", action="store_true",
                       help="LiBai's spelling, with --tokenizer-name BertTokenizer: the uncased WordPiece")
    if preprocessing:
        group.add_argument("--do-chinese-wwm", dest="chinese_wwm", action="store_true",
                           help="BertWordPiece*: write each character that continues a Chinese word (jieba, up to 3 "
                                "characters) as its ##X id, for whole-word masking (LiBai's flag)")
    group.add_argument("--vocab-file", "--vocab", dest="vocab_file", help="GPT-2 vocab.json or BERT vocab.txt")
    group.add_argument("--merge-file", "--merges-file", dest="merge_file", help="GPT-2 merges.txt")
    group.add_argument("--tokenizer-model", help="SentencePiece .model, or local tokenizer.json / its directory")
    group.add_argument("--vocab-size", type=int, help="NullTokenizer vocabulary size (eod = vocab size - 1)")
    group.add_argument(
        "--tokenizer-hf-no-include-special-tokens",
        dest="tokenizer_hf_include_special_tokens",
        action="store_false",
        help="HuggingFaceTokenizer: do not add the tokenizer's special tokens (e.g. BOS) to every text; "
             "BertWordPiece*: accepted, and already the default (no [CLS]/[SEP])",
    )
    if not preprocessing:
        return
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
    if args.tokenizer_name is not None:
        kind = _libai_tokenizer_type(args.tokenizer_name, args.do_lower_case)
        files = {}
        if kind == "GPTSentencePieceTokenizer":  # LiBai's T5Tokenizer reads its model from --vocab-file
            if args.tokenizer_model is not None:
                raise ValueError("--tokenizer-name T5Tokenizer reads its SentencePiece model from --vocab-file; "
                                 "drop --tokenizer-model")
            files = {"vocab_file": None, "tokenizer_model": args.vocab_file}
        return dataclass_from_args(TokenizerConfig, args, tokenizer_type=kind, **files)
    if args.do_lower_case:
        raise ValueError("--do-lower-case goes with --tokenizer-name BertTokenizer "
                         "(with --tokenizer-type, choose BertWordPieceLowerCase)")
    if args.tokenizer_type is None:
        return None
    try:
        return dataclass_from_args(TokenizerConfig, args)
    except ValueError as error:
        raise ValueError(_FIELD_NAMES.sub(lambda match: FIELD_FLAGS[match.group()], str(error))) from None


def _libai_tokenizer_type(name: str, lower_case: bool) -> str:
    """Our --tokenizer-type for LiBai's `--tokenizer-name` (and `--do-lower-case`).

    Raises:
        ValueError: a LiBai tokenizer we do not build, or --do-lower-case with a tokenizer that has no cases.
    """
    if name in LIBAI_UNSUPPORTED:
        raise ValueError(f"--tokenizer-name {name} is not supported: {LIBAI_UNSUPPORTED[name]}")
    if name == "BertTokenizer":
        return "BertWordPieceLowerCase" if lower_case else "BertWordPieceCase"
    if lower_case:
        raise ValueError(f"--do-lower-case only applies to --tokenizer-name BertTokenizer, not {name}")
    return LIBAI_TOKENIZER_TYPES[name]
