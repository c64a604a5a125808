"""`merge-datasets`: Megatron's tools/merge_datasets.py: concatenate token datasets into one.

    merge-datasets --input DIR --output-prefix out/merged          # every dataset in DIR, sorted by name
    merge-datasets --inputs out/a out/b --output-prefix out/merged  # these, in this order

`.bin/.idx` pairs are merged as Megatron merges them (into `out/merged.bin/.idx`). A directory may also
hold Arrow folders and MindRecord files, such as the parts of a fanned-out `preprocess-data --rank R
--world-size N --output-format mmap arrow mindrecord`: each format found is merged on its own, into
`out/merged_arrow` and `out/merged.mindrecord`, the names preprocess-data gives a prefix's outputs.
"""

from __future__ import annotations

import argparse
import logging
from dataclasses import dataclass

from indexed_dataset import convert, datasets_in_directory, format_of, merge_datasets, open_reader
from indexed_dataset.formats import dataset_path

from .cli_common import run_command, setup_logging
from .errors import InputError

PROG = "merge-datasets"
logger = logging.getLogger(__name__)


@dataclass(kw_only=True, slots=True, frozen=True)
class MergeConfig:
    """One merge: either a directory (Megatron's lexicographic order) or explicit datasets."""

    output_prefix: str
    """The merged datasets' stem: `PREFIX.bin/.idx`, `PREFIX_arrow`, `PREFIX.mindrecord`."""
    input_directory: str | None = None
    """Merge every dataset in this directory, each format in lexicographic order of names."""
    input_prefixes: tuple[str, ...] = ()
    """Merge these datasets (all of one format), in this order."""

    def __post_init__(self) -> None:
        if (self.input_directory is None) == (not self.input_prefixes):
            raise ValueError("give either an input directory or input prefixes, not both or neither")

    def datasets(self) -> dict[str, list[str]]:
        """Format -> the datasets to merge into that format's output, in order.

        Raises:
            TokenmillError: nothing to merge, or explicit datasets of several formats.
        """
        if self.input_directory is not None:
            return datasets_in_directory(self.input_directory)
        formats = {path: format_of(path) for path in self.input_prefixes}
        if len(set(formats.values())) > 1:
            listed = ", ".join(f"{path} ({fmt})" for path, fmt in formats.items())
            raise InputError(f"the datasets to merge must share one format, got {listed}")
        return {formats[self.input_prefixes[0]]: list(self.input_prefixes)}


def merge(config: MergeConfig) -> dict[str, str]:
    """Merge each format's datasets into its output; returns format -> output path.

    mmap pairs go through `merge_datasets` (Megatron's byte layout), Arrow and MindRecord through
    `convert` (rows batched as preprocess-data batches them, so merged parts give a one-run's bytes).
    """
    outputs = {}
    for fmt, paths in config.datasets().items():
        output = dataset_path(fmt, config.output_prefix)
        if fmt == "mmap":
            merge_datasets(paths, output)
        else:
            convert(paths, output, target_format=fmt, source_format=fmt)
        merged = open_reader(output, fmt)
        logger.info("Merged %d %s datasets into %s: %d documents, %d sequences, %d tokens", len(paths), fmt, output,
                    merged.num_documents, merged.num_sequences, merged.num_tokens)
        outputs[fmt] = output
    return outputs


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--input", help="directory of datasets (.bin/.idx pairs, Arrow folders, .mindrecord "
                                        "files), each format merged in lexicographic order")
    source.add_argument("--inputs", nargs="+", help="datasets of one format, merged in the order given")
    parser.add_argument("--output-prefix", required=True,
                        help="the merged datasets are PREFIX.bin/.idx, PREFIX_arrow, PREFIX.mindrecord")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run merge-datasets with `argv` (default: sys.argv[1:]); returns the exit code."""
    args = build_parser().parse_args(argv)
    setup_logging()

    def command() -> int:
        merge(MergeConfig(output_prefix=args.output_prefix, input_directory=args.input,
                          input_prefixes=tuple(args.inputs or ())))
        return 0

    return run_command(PROG, command)


if __name__ == "__main__":
    raise SystemExit(main())
