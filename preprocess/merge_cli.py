"""`merge-datasets`: Megatron's tools/merge_datasets.py: concatenate token datasets into one.

    merge-datasets --input DIR --output-prefix out/merged          # every dataset in DIR, sorted by name
    merge-datasets --inputs out/a out/b --output-prefix out/merged  # these, in this order

`.bin/.idx` pairs are merged as Megatron merges them (into `out/merged.bin/.idx`). A directory may also
hold Arrow folders and MindRecord files, such as the parts of a fanned-out `preprocess-data --rank R
--world-size N --output-format mmap arrow mindrecord`: each format found is merged on its own, into
`out/merged_arrow` and `out/merged.mindrecord`, the names preprocess-data gives a prefix's outputs.
MindRecord parts of several shards (`--mindrecord-shards 4`: `x.mindrecord0..3`) are merged into as
many shards (`out/merged.mindrecord0..3`), which is what one run with the same flags writes. The
output directory is created when missing.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass

from indexed_dataset import convert, datasets_in_directory, format_of, merge_datasets, open_reader
from indexed_dataset.checksums import remove_dataset_checksums, verify_dataset_checksums, write_dataset_checksums
from indexed_dataset.cli_parser import CommandParser
from indexed_dataset.cli_support import run_command
from indexed_dataset.formats import check_replaceable, dataset_files, dataset_path, files_read
from indexed_dataset.path_rules import refuse_output_over_inputs

from .cli_common import setup_logging
from .errors import InputError
from .fanout import DONE_FOLDER_SUFFIX, DONE_SUFFIX
from .outputs import remove_output

PROG = "merge-datasets"
logger = logging.getLogger(__name__)
# A fanned-out part's name: `{base}_part{R}-of-{N}{rest}` (see `PreprocessConfig.part_prefix`).
_PART_NAME = re.compile(r"^(?P<base>.*)_part(?P<rank>\d+)-of-(?P<world>\d+)(?P<rest>_.*)$")


@dataclass(kw_only=True, slots=True, frozen=True)
class MergeConfig:
    """One merge: either a directory (Megatron's lexicographic order) or explicit datasets."""

    output_prefix: str
    """The merged datasets' stem: `PREFIX.bin/.idx`, `PREFIX_arrow`, `PREFIX.mindrecord`."""
    input_directory: str | None = None
    """Merge every dataset in this directory, each format in lexicographic order of names."""
    input_prefixes: tuple[str, ...] = ()
    """Merge these datasets (all of one format), in this order."""
    verify: bool = True
    """Check each input against its checksum manifest (when it has one) before reading it."""

    def __post_init__(self) -> None:
        if (self.input_directory is None) == (not self.input_prefixes):
            raise ValueError("give either an input directory or input prefixes, not both or neither")
        if not self.output_prefix:
            raise ValueError("the output prefix is empty")

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


def _part_name(base: str, rank: int, world_size: int) -> str:
    """`{base}_part{rank}-of-{world_size}`, the rank zero-padded as preprocess-data writes it."""
    return f"{base}_part{rank:0{len(str(world_size))}d}-of-{world_size}"


def check_complete_parts(paths: Iterable[str]) -> None:
    """Refuse an incomplete set of fanned-out parts: every `_partR-of-N_` name needs all N ranks beside
    it, and where the run's `{base}_done/` folder is there, each part needs its done marker (a part
    without one was interrupted).

    Raises:
        InputError: naming the missing or unfinished parts.
    """
    groups: dict[tuple[str, str, int, str], set[int]] = {}
    for path in paths:
        directory, name = os.path.split(os.path.normpath(path))
        match = _PART_NAME.match(name)
        if match:
            key = (directory, match["base"], int(match["world"]), match["rest"])
            groups.setdefault(key, set()).add(int(match["rank"]))
    for (directory, base, world, rest), ranks in sorted(groups.items()):
        missing = [os.path.join(directory, _part_name(base, r, world) + rest) for r in range(world) if r not in ranks]
        if missing:
            raise InputError(f"incomplete fan-out: {len(missing)} of {world} parts missing: {', '.join(missing)}")
        done_folder = os.path.join(directory, base + DONE_FOLDER_SUFFIX)
        if not os.path.isdir(done_folder):
            continue  # parts copied without their markers: the names are all there is to check
        unfinished = [_part_name(base, r, world) for r in sorted(ranks)
                      if not os.path.isfile(os.path.join(done_folder, _part_name(base, r, world) + DONE_SUFFIX))]
        if unfinished:
            raise InputError(f"{done_folder}: no done marker for {', '.join(unfinished)} (interrupted parts; rerun "
                             "their preprocess-data command first)")


def merge(config: MergeConfig) -> dict[str, str]:
    """Merge each format's datasets into its output; returns format -> output path.

    Every input of every format is fully validated, and every output checked not to overwrite an input
    or a file of the user's (`formats.check_replaceable`), before anything is written, and if writing one
    format's output fails, the outputs already written are removed: a merge leaves all or nothing (a
    missing output directory is created, and removed again if the merge fails).
    mmap pairs go through `merge_datasets` (Megatron's byte layout), Arrow and MindRecord through
    `convert` (rows batched as preprocess-data batches them, so merged parts give a one-run's bytes).
    """
    datasets = config.datasets()
    check_complete_parts(path for paths in datasets.values() for path in paths)
    mindrecord_shards = 1
    inputs: list[str] = []
    for fmt, paths in datasets.items():
        readers = [open_reader(path, fmt) for path in paths]
        for path, reader in zip(paths, readers):
            if config.verify:
                verify_dataset_checksums(fmt, path, files_read(fmt, reader))
            reader.validate()
        if fmt == "mindrecord":
            mindrecord_shards = _common_shard_count(paths, readers)
        inputs += [file for reader in readers for file in files_read(fmt, reader)]
    # Every format's output is checked before the first is written: a merge leaves all or nothing.
    for fmt in datasets:
        output = dataset_path(fmt, config.output_prefix)
        refuse_output_over_inputs(dataset_files(fmt, output, mindrecord_shards), inputs)
        check_replaceable(fmt, output, mindrecord_shards)
    created = _make_output_directory(config.output_prefix)
    outputs = {}
    try:
        for fmt, paths in datasets.items():
            output = dataset_path(fmt, config.output_prefix)
            # The inputs were verified above; `convert` writes its output's checksum manifest itself.
            if fmt == "mmap":
                remove_dataset_checksums(output)
                merge_datasets(paths, output)
                outputs[fmt] = output  # from here on, a failure removes it (with its manifest)
                write_dataset_checksums(output, dataset_files(fmt, output))
            elif fmt == "mindrecord":
                convert(paths, output, target_format=fmt, source_format=fmt, num_shards=mindrecord_shards,
                        verify=False)
            else:
                convert(paths, output, target_format=fmt, source_format=fmt, verify=False)
            outputs[fmt] = output
            merged = open_reader(output, fmt)
            logger.info("Merged %d %s datasets into %s: %d documents, %d sequences, %d tokens", len(paths), fmt,
                        output, merged.num_documents, merged.num_sequences, merged.num_tokens)
    except BaseException:
        for fmt, output in outputs.items():
            remove_output(fmt, output, mindrecord_shards)
        _remove_created_directories(config.output_prefix, created)
        raise
    return outputs


def _common_shard_count(paths: list[str], readers: list) -> int:
    """The number of shards of every MindRecord to merge (the merged one gets as many).

    Raises:
        InputError: the datasets have different numbers of shards.
    """
    counts = {path: len(reader.paths) for path, reader in zip(paths, readers)}
    if len(set(counts.values())) > 1:
        listed = ", ".join(f"{path} ({count})" for path, count in counts.items())
        raise InputError(f"the MindRecord datasets to merge have different numbers of shards: {listed}")
    return counts[paths[0]]


def _make_output_directory(output_prefix: str) -> str | None:
    """Create the directory of `output_prefix` and its missing parents; returns the topmost one created
    (None when the directory was there)."""
    directory = os.path.dirname(os.path.abspath(output_prefix))
    top = None
    while not os.path.isdir(directory):
        top, directory = directory, os.path.dirname(directory)
    if top is not None:
        os.makedirs(os.path.dirname(os.path.abspath(output_prefix)))
    return top


def _remove_created_directories(output_prefix: str, top: str | None) -> None:
    """Remove the directories `_make_output_directory` created, innermost first, if they are empty."""
    if top is None:
        return
    directory = os.path.dirname(os.path.abspath(output_prefix))
    with contextlib.suppress(OSError):  # not empty: someone else put something there meanwhile
        while True:
            os.rmdir(directory)
            if directory == top:
                break
            directory = os.path.dirname(directory)


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser(prog=PROG, description=__doc__.splitlines()[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--input", help="directory of datasets (.bin/.idx pairs, Arrow folders, .mindrecord "
                                        "files), each format merged in lexicographic order")
    source.add_argument("--inputs", nargs="+", help="datasets of one format, merged in the order given")
    parser.add_argument("--output-prefix", required=True,
                        help="the merged datasets are PREFIX.bin/.idx, PREFIX_arrow, PREFIX.mindrecord")
    parser.add_argument("--no-verify", dest="verify", action="store_false",
                        help="read inputs without checking them against their checksum manifest (*.sha256sums)")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run merge-datasets with `argv` (default: sys.argv[1:]); returns the exit code."""
    args = build_parser().parse_args(argv)
    setup_logging()

    def command() -> int:
        merge(MergeConfig(output_prefix=args.output_prefix, input_directory=args.input,
                          input_prefixes=tuple(args.inputs or ()), verify=args.verify))
        return 0

    return run_command(PROG, command)


if __name__ == "__main__":
    raise SystemExit(main())
