"""`merge-datasets`: Megatron's tools/merge_datasets.py: concatenate `.bin/.idx` pairs into one.

    merge-datasets --input DIR --output-prefix out/merged          # every pair in DIR, sorted by name
    merge-datasets --inputs out/a out/b --output-prefix out/merged  # these, in this order
"""

from __future__ import annotations

import argparse
import logging
from dataclasses import dataclass

from indexed_dataset import IndexedDataset, merge_datasets, prefixes_in_directory

from .cli_common import run_command, setup_logging

PROG = "merge-datasets"
logger = logging.getLogger(__name__)


@dataclass(kw_only=True, slots=True, frozen=True)
class MergeConfig:
    """One merge: either a directory (Megatron's lexicographic order) or explicit prefixes."""

    output_prefix: str
    """The merged dataset's prefix."""
    input_directory: str | None = None
    """Merge every pair in this directory, in lexicographic order of file stems."""
    input_prefixes: tuple[str, ...] = ()
    """Merge these datasets, in this order."""

    def __post_init__(self) -> None:
        if (self.input_directory is None) == (not self.input_prefixes):
            raise ValueError("give either an input directory or input prefixes, not both or neither")

    def prefixes(self) -> list[str]:
        if self.input_directory is not None:
            return prefixes_in_directory(self.input_directory)
        return list(self.input_prefixes)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--input", help="directory of .bin/.idx pairs, merged in lexicographic order")
    source.add_argument("--inputs", nargs="+", help="dataset prefixes, merged in the order given")
    parser.add_argument("--output-prefix", required=True, help="the merged dataset is PREFIX.bin/.idx")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run merge-datasets with `argv` (default: sys.argv[1:]); returns the exit code."""
    args = build_parser().parse_args(argv)
    setup_logging()

    def command() -> int:
        config = MergeConfig(output_prefix=args.output_prefix, input_directory=args.input,
                             input_prefixes=tuple(args.inputs or ()))
        prefixes = config.prefixes()
        merge_datasets(prefixes, config.output_prefix)
        merged = IndexedDataset(config.output_prefix)
        logger.info("Merged %d datasets into %s: %d documents, %d sequences, %d tokens", len(prefixes),
                    config.output_prefix, merged.num_documents, merged.num_sequences, merged.num_tokens)
        return 0

    return run_command(PROG, command)


if __name__ == "__main__":
    raise SystemExit(main())
