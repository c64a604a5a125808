"""`preprocess-data`: Megatron's tools/preprocess_data.py, same flags, same output bytes, and more.

    preprocess-data --input corpus.jsonl --output-prefix out/corpus --tokenizer-type GPT2BPETokenizer \
        --vocab-file gpt2-vocab.json --merge-file gpt2-merges.txt --append-eod
    preprocess-data --input a.jsonl 'shards/*.jsonl.gz' parquet_dir/ hf_saved/ --output-prefix out/c \
        --output-format mmap arrow mindrecord --keep-fields id ... # several inputs, formats in one pass
    srun -n 8 preprocess-data --input 'shards/*' --output-prefix out/c ...   # rank R writes out/c_partR-of-8_*
    merge-datasets --input out --output-prefix out/c_text_document          # the single-process bytes
"""

from __future__ import annotations

import argparse
import logging

from indexed_dataset.arrow import DEFAULT_SHARD_SIZE
from indexed_dataset.cli_parser import CommandParser
from indexed_dataset.cli_support import run_command
from indexed_dataset.formats import FORMATS

from .cli_common import end_program, setup_logging
from .config import DATASET_IMPLS, DEFAULT_LANG, TOKEN_DTYPE_RULES, PreprocessConfig
from .fanout import rank_from_environment
from .inputs import DEFAULT_CHUNK_BYTES, DEFAULT_MAX_LINE_MB
from .pipeline import preprocess_data
from .tokenizers.config import dataclass_from_args
from .tokenizers.flags import add_tokenizer_arguments, tokenizer_config_from_args
from .workers import DEFAULT_ENCODER_MEMORY_LIMIT_MB

PROG = "preprocess-data"
logger = logging.getLogger(__name__)


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser(prog=PROG, description=__doc__.splitlines()[0])
    data = parser.add_argument_group("input and output")
    source = data.add_mutually_exclusive_group(required=True)
    source.add_argument("--input", nargs="+",
                        help="files, globs and directories: .jsonl/.json (.gz/.zst), .parquet, .arrow, "
                             "save_to_disk folders; read in sorted path order")
    source.add_argument("--hf-dataset", metavar="NAME_OR_PATH",
                        help="datasets.load_dataset(..., streaming=True) of a local builder "
                             "(json, parquet, arrow, text, csv) or folder; never the Hub")
    data.add_argument("--hf-split", default="train", help="split of --hf-dataset (default train)")
    data.add_argument("--hf-data-files", nargs="+", default=[], help="data_files of --hf-dataset")
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
    formats = parser.add_argument_group("output formats")
    formats.add_argument("--output-format", nargs="+", choices=FORMATS, default=["mmap"], dest="output_formats",
                         help="written in one pass: mmap (PREFIX_{key}_{level}.bin/.idx), arrow "
                              "(PREFIX_{key}_{level}_arrow/), mindrecord (PREFIX_{key}_{level}.mindrecord)")
    formats.add_argument("--shard-size", type=int, default=DEFAULT_SHARD_SIZE,
                         help=f"arrow: bytes per data-*.arrow shard (default {DEFAULT_SHARD_SIZE})")
    formats.add_argument("--keep-fields", type=_comma_list, default=(), metavar="F1,F2",
                         help="arrow: copy these scalar fields (number or string) of each document into its row")
    formats.add_argument("--mindrecord-shards", type=int, default=1, help="mindrecord: data files per output")
    formats.add_argument("--empty-documents", choices=("write", "reject"), default="write",
                         help="mindrecord: write documents without tokens as empty rows, or fail")
    add_tokenizer_arguments(parser)
    fanout = parser.add_argument_group("fan-out over processes (resumable)")
    fanout.add_argument("--rank", type=int,
                        help="this process's rank (default: $RANK, else srun's $SLURM_PROCID, else 0)")
    fanout.add_argument("--world-size", type=int,
                        help="processes sharing the input files (default: $WORLD_SIZE, else srun's "
                             "$SLURM_STEP_NUM_TASKS, else 1)")
    fanout.add_argument("--overwrite", action="store_true",
                        help="redo a run (or fanned-out part) already marked done in PREFIX_done/")
    runtime = parser.add_argument_group("runtime")
    runtime.add_argument("--workers", type=int, default=1,
                         help="1 tokenizes in one encoder process on all cores; N > 1 uses N worker processes")
    runtime.add_argument("--encoder-memory-limit-mb", type=int, default=DEFAULT_ENCODER_MEMORY_LIMIT_MB, metavar="MB",
                         help="replace an encoder process by a fresh one once its resident memory passes MB "
                              "(per worker; keeps memory bounded on any vocabulary, same ids)")
    runtime.add_argument("--partitions", type=int, default=1,
                         help="write as N contiguous partial datasets, merged at the end (same output)")
    runtime.add_argument("--keep-sequential-samples", action="store_true",
                         help="accepted for Megatron compatibility: documents always keep input order")
    runtime.add_argument("--log-interval", type=int, default=1000, metavar="N",
                         help="without a terminal, log a progress line each time N more documents are done "
                              "(counted per finished chunk of --chunk-bytes; a terminal shows a bar instead)")
    runtime.add_argument("--chunk-bytes", type=int, default=DEFAULT_CHUNK_BYTES, metavar="BYTES",
                         help="bytes of input per tokenizing task")
    runtime.add_argument("--max-line-mb", type=int, default=DEFAULT_MAX_LINE_MB, metavar="MB",
                         help="the longest JSON line read, in MiB: a longer one (lost newlines, an endless stream) "
                              "stops the run with its file, line and byte offset, before memory runs out")
    return parser


def _comma_list(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


def config_from_args(args: argparse.Namespace) -> PreprocessConfig:
    rank, world_size = rank_from_environment()
    return dataclass_from_args(
        PreprocessConfig, args,
        tokenizer=tokenizer_config_from_args(args),
        input=tuple(args.input or ()),
        json_keys=tuple(args.json_keys),
        hf_data_files=tuple(args.hf_data_files),
        output_formats=tuple(args.output_formats),
        rank=rank if args.rank is None else args.rank,
        world_size=world_size if args.world_size is None else args.world_size,
    )


def main(argv: list[str] | None = None) -> int:
    """Run preprocess-data with `argv`; returns the exit code. Run as the program (`argv` None: the
    `preprocess-data` script, `python -m preprocess.cli`), it reads sys.argv[1:] and, once the run is
    over, ends the process itself without the interpreter's teardown (see `end_program`)."""
    args = build_parser().parse_args(argv)
    setup_logging()

    def command() -> int:
        summary = preprocess_data(config_from_args(args))
        logger.info("%s", summary.describe())
        return 0

    code = run_command(PROG, command)
    if argv is None:
        end_program(code)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
