"""`convert`: copy a token dataset into another format (mmap `.bin/.idx`, Arrow, MindRecord).

    convert --from mmap --to arrow data/corpus_text_document out/corpus_arrow
    convert --from arrow --to mindrecord out/corpus_arrow out/corpus.mindrecord --mindrecord-shards 4
    convert --from mindrecord --to mmap out/corpus.mindrecord out/back_text_document --dtype uint16

Everything here is `indexed_dataset.convert.convert(...)` in Python.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

import numpy as np

from indexed_dataset.cli_parser import CommandParser
from indexed_dataset.cli_support import EXIT_ERROR, run_command
from indexed_dataset.convert import DEFAULT_BATCH_DOCUMENTS, convert
from indexed_dataset.formats import FORMATS

from .cli_common import setup_logging

PROG = "convert"
DTYPES = ("uint8", "int8", "int16", "uint16", "int32", "int64")
EMPTY_DOCUMENT_POLICIES = ("write", "reject")


@dataclass(kw_only=True, slots=True)
class ConvertConfig:
    """Everything `convert` needs."""

    source_format: str
    """Format of the input: mmap, arrow or mindrecord."""
    target_format: str
    """Format of the output: mmap, arrow or mindrecord."""
    input: str
    """Input dataset: mmap prefix, Arrow directory or `.arrow` file, `.mindrecord` file."""
    output: str
    """Output: mmap prefix, Arrow directory, MindRecord file name."""
    dtype: str | None = None
    """Token dtype of the output; None: Megatron's rule on the ids for mmap, the input's otherwise."""
    batch_documents: int = DEFAULT_BATCH_DOCUMENTS
    """Documents per read/write batch."""
    arrow_shard_size: int | None = None
    """Arrow: bytes per `data-*.arrow` shard (default 500 MB)."""
    mindrecord_shards: int | None = None
    """MindRecord: number of data files (default 1)."""
    mindrecord_header_size: int | None = None
    """MindRecord: header bytes (default 16 MiB)."""
    mindrecord_page_size: int | None = None
    """MindRecord: page bytes (default 32 MiB)."""
    empty_documents: str | None = None
    """MindRecord: "write" empty documents as empty rows (default) or "reject" them."""
    vocab_size: int | None = None
    """The tokenizer's vocabulary size: every id must be below it; None: ids are not checked."""
    verify: bool = True
    """Check each input against its checksum manifest (when it has one) before reading it."""

    def __post_init__(self) -> None:
        for name in ("source_format", "target_format"):
            if getattr(self, name) not in FORMATS:
                raise ValueError(f"{name} must be one of {', '.join(FORMATS)}, got {getattr(self, name)!r}")
        if self.dtype is not None and self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.batch_documents <= 0:
            raise ValueError(f"batch_documents must be positive, got {self.batch_documents}")
        if self.vocab_size is not None and self.vocab_size < 1:
            raise ValueError(f"--vocab-size must be >= 1, got {self.vocab_size}")
        for name, fmt in (
            ("arrow_shard_size", "arrow"),
            ("mindrecord_shards", "mindrecord"),
            ("mindrecord_header_size", "mindrecord"),
            ("mindrecord_page_size", "mindrecord"),
            ("empty_documents", "mindrecord"),
        ):
            if getattr(self, name) is not None and self.target_format != fmt:
                flag = "--" + name.replace("_", "-")
                raise ValueError(f"{flag} applies only to --to {fmt}, not --to {self.target_format}")

    def writer_options(self) -> dict:
        """The target writer's keyword options that were set."""
        names = {
            "arrow_shard_size": "shard_size",
            "mindrecord_shards": "num_shards",
            "mindrecord_header_size": "header_size",
            "mindrecord_page_size": "page_size",
            "empty_documents": "empty_documents",
        }
        return {option: getattr(self, field) for field, option in names.items() if getattr(self, field) is not None}


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser(prog=PROG, description=__doc__.split("\n")[0])
    parser.add_argument("--from", dest="source_format", required=True, choices=FORMATS, help="format of INPUT")
    parser.add_argument("--to", dest="target_format", required=True, choices=FORMATS, help="format of OUTPUT")
    parser.add_argument("input", metavar="INPUT",
                        help="dataset to read: mmap prefix, Arrow folder or .arrow file, .mindrecord file "
                             "(x.mindrecord also names the shards x.mindrecord0..N-1)")
    parser.add_argument("output", metavar="OUTPUT",
                        help="dataset to write: mmap prefix, Arrow folder, .mindrecord file name")
    parser.add_argument("--dtype", choices=DTYPES, help="output token dtype (default: for mmap Megatron's rule on the data, "
                        "uint16 if the largest id + 1 < 65500 else int32; otherwise the input's)")
    parser.add_argument("--batch-documents", type=int, default=DEFAULT_BATCH_DOCUMENTS, metavar="N",
                        help="documents read and written per batch (memory grows with it)")
    parser.add_argument("--arrow-shard-size", type=int, metavar="BYTES",
                        help="--to arrow: bytes per data-*.arrow shard (default 500 MB)")
    parser.add_argument("--mindrecord-shards", type=int, metavar="N",
                        help="--to mindrecord: data files (default 1)")
    parser.add_argument("--mindrecord-header-size", type=int, metavar="BYTES",
                        help="--to mindrecord: header bytes (default 16 MiB)")
    parser.add_argument("--mindrecord-page-size", type=int, metavar="BYTES",
                        help="--to mindrecord: page bytes (default 32 MiB)")
    parser.add_argument("--empty-documents", choices=EMPTY_DOCUMENT_POLICIES,
                        help="--to mindrecord: write documents without tokens as empty rows, or fail (default write)")
    parser.add_argument("--vocab-size", type=int, metavar="N",
                        help="the tokenizer's vocabulary size: an id outside [0, N) fails, naming the document")
    parser.add_argument("--no-verify", dest="verify", action="store_false",
                        help="read inputs without checking them against their checksum manifest (*.sha256sums)")
    return parser


def parse_args(argv: list[str] | None) -> ConvertConfig:
    return ConvertConfig(**vars(build_parser().parse_args(argv)))


def main(argv: list[str] | None = None) -> int:
    """Run convert with `argv` (default: sys.argv[1:]); returns the exit code (1 for a bad input or
    option value, 130 / 143 when interrupted, each with one line on stderr)."""
    setup_logging()  # plain lines on stderr, as every other data command writes them

    def command() -> int:
        config = parse_args(argv)
        convert(
            config.input,
            config.output,
            target_format=config.target_format,
            source_format=config.source_format,
            dtype=np.dtype(config.dtype) if config.dtype else None,
            batch_documents=config.batch_documents,
            vocab_size=config.vocab_size,
            verify=config.verify,
            **config.writer_options(),
        )
        return 0

    return run_command(PROG, command, value_error_exit=EXIT_ERROR)


if __name__ == "__main__":
    sys.exit(main())
