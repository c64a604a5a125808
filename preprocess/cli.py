"""`preprocess-data`: Megatron's tools/preprocess_data.py, same flags, same output bytes.

    preprocess-data --input corpus.jsonl --output-prefix out/corpus --tokenizer-type GPT2BPETokenizer \
        --vocab-file gpt2-vocab.json --merge-file gpt2-merges.txt --append-eod
"""

from __future__ import annotations

import argparse
import logging

from .cli_common import run_command, setup_logging
from .config import DATASET_IMPLS, DEFAULT_LANG, TOKEN_DTYPE_RULES, PreprocessConfig
from .inputs import DEFAULT_CHUNK_BYTES
from .pipeline import preprocess_data
from .tokenizers.config import dataclass_from_args
from .tokenizers.flags import add_tokenizer_arguments, tokenizer_config_from_args

PROG = "preprocess-data"
logger = logging.getLogger(__name__)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    data = parser.add_argument_group("input and output")
    data.add_argument("--input", required=True,
                      help="JSON-lines file (.jsonl/.json, optionally .gz), glob or directory")
    data.add_argument("--output-prefix", required=True, help="outputs are PREFIX_{key}_document.bin/.idx")
    data.add_argument("--json-keys", nargs="+", default=["text"], help="keys to tokenize, one output each")
    data.add_argument("--append-eod", action="store_true", help="append the eod token to every non-empty document")
    data.add_argument("--split-sentences", action="store_true", help="one sequence per sentence (rule-based, offline)")
    data.add_argument("--keep-newlines", action="store_true",
                      help="keep newlines after sentences (with --split-sentences)")
    data.add_argument("--lang", default=DEFAULT_LANG, help="sentence-splitting language (with --split-sentences)")
    data.add_argument("--dataset-impl", default="mmap", help=f"output implementation: {', '.join(DATASET_IMPLS)}")
    data.add_argument("--token-dtype-rule", choices=TOKEN_DTYPE_RULES, default="megatron",
                      help="megatron: uint16 iff vocab < 65500 (byte-compatible); tight: uint16 iff vocab <= 65536")
    data.add_argument("--skip-invalid", action="store_true", help="skip and count invalid lines instead of failing")
    add_tokenizer_arguments(parser)
    runtime = parser.add_argument_group("runtime")
    runtime.add_argument("--workers", type=int, default=1,
                         help="1: tokenize in this process on all cores (default); N: N worker processes")
    runtime.add_argument("--partitions", type=int, default=1,
                         help="write as N contiguous partial datasets, merged at the end (same output)")
    runtime.add_argument("--keep-sequential-samples", action="store_true",
                         help="accepted for Megatron compatibility: documents always keep input order")
    runtime.add_argument("--log-interval", type=int, default=1000, help="log progress every N documents")
    runtime.add_argument("--chunk-bytes", type=int, default=DEFAULT_CHUNK_BYTES, help="input bytes per task")
    return parser


def config_from_args(args: argparse.Namespace) -> PreprocessConfig:
    return dataclass_from_args(PreprocessConfig, args, tokenizer=tokenizer_config_from_args(args),
                               json_keys=tuple(args.json_keys))


def main(argv: list[str] | None = None) -> int:
    """Run preprocess-data with `argv` (default: sys.argv[1:]); returns the exit code."""
    args = build_parser().parse_args(argv)
    setup_logging()

    def command() -> int:
        summary = preprocess_data(config_from_args(args))
        logger.info("%s", summary.describe())
        return 0

    return run_command(PROG, command)


if __name__ == "__main__":
    raise SystemExit(main())
