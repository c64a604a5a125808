"""`build-indices`: build a training run's index arrays ahead of time (no GPU, no torch.distributed).

    build-indices --data-path 0.7 data/a_text_document 0.3 data/b_text_document --split 949,50,1 \\
        --seq-length 2048 --seed 1234 --train-samples 10000000 --valid-samples 100000 --timings

Prints progress on stderr; with `--timings`, one JSON line on stdout:
{"document_index": s, "sample_index": s, "shuffle_index": s, "blend_index": s} (seconds spent building
each phase, summed over splits and datasets; loading from the cache counts nothing).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import NoReturn, Optional

from indexed_dataset.cli_parser import CommandParser, int_at_least, seed_value
from indexed_dataset.cli_support import EXIT_ERROR, run_command

from .prebuild import BuildIndicesConfig, build_indices
from .run_length import (
    DEFAULT_EVAL_INTERVAL,
    DEFAULT_EVAL_ITERS,
    EVAL_INTERVAL_FLAG,
    EVAL_ITERS_FLAG,
    GLOBAL_BATCH_FLAG,
    TRAIN_ITERS_FLAG,
    RunLength,
)
from .splits import DEFAULT_SPLIT, SPLIT_NAMES

PROG = "build-indices"


class _ArgumentParser(CommandParser):
    """Reports a bad flag as a ValueError, so `main` prints it as its one error line."""

    def error(self, message: str) -> NoReturn:
        raise ValueError(self.full_message(message))


def build_parser() -> argparse.ArgumentParser:
    parser = _ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    parser.add_argument("--data-path", nargs="+", metavar="[WEIGHT] PREFIX", help="datasets, optionally weighted")
    parser.add_argument("--train-data-path", nargs="+", metavar="[WEIGHT] PREFIX", help="train split datasets (used whole)")
    parser.add_argument("--valid-data-path", nargs="+", metavar="[WEIGHT] PREFIX", help="valid split datasets (used whole)")
    parser.add_argument("--test-data-path", nargs="+", metavar="[WEIGHT] PREFIX", help="test split datasets (used whole)")
    parser.add_argument("--split", help=f"split fractions with --data-path, e.g. 949,50,1 (default {DEFAULT_SPLIT})")
    parser.add_argument("--seq-length", type=int, required=True, help="tokens per sample")
    parser.add_argument("--seed", type=seed_value, default=1234, help="random seed of the shuffles (default 1234)")
    for name in ("train", "valid", "test"):
        parser.add_argument(f"--{name}-samples", type=int_at_least(0), help=f"{name} samples (default: one epoch)")
    run = parser.add_argument_group("or the counts train derives from a run's length (Megatron's rule)")
    run.add_argument(TRAIN_ITERS_FLAG, type=int, help="training steps; with the flags below gives all three counts")
    run.add_argument(GLOBAL_BATCH_FLAG, type=int, help="samples per step (required with --train-iters)")
    run.add_argument(EVAL_INTERVAL_FLAG, type=int, default=DEFAULT_EVAL_INTERVAL,
                     help=f"steps between evaluations (default {DEFAULT_EVAL_INTERVAL}, as train)")
    run.add_argument(EVAL_ITERS_FLAG, type=int, default=DEFAULT_EVAL_ITERS,
                     help=f"global batches per evaluation (default {DEFAULT_EVAL_ITERS}, as train)")
    parser.add_argument("--data-cache-path", help="index cache directory (default: index-cache/ beside the data)")
    parser.add_argument("--dump", metavar="DIR", help="also write every split's arrays under DIR")
    parser.add_argument("--timings", action="store_true", help="print build seconds per phase as one JSON line")
    return parser


def parse_args(argv: Optional[list[str]]) -> BuildIndicesConfig:
    options = vars(build_parser().parse_args(argv))
    run_names = ("train_iters", "global_batch_size", "eval_interval", "eval_iters")
    run_flags = {name: options.pop(name) for name in run_names}
    if run_flags["train_iters"] is not None:
        if run_flags["global_batch_size"] is None:
            raise ValueError(f"{TRAIN_ITERS_FLAG} needs {GLOBAL_BATCH_FLAG}")
        options["run_length"] = RunLength(**run_flags)
    return BuildIndicesConfig(**options)


def _sample_count(config: BuildIndicesConfig, split: str, indexed: int) -> str:
    """"N samples", or with a requested size "R requested, N indexed (whole epochs)": the index covers whole
    epochs, so it holds more samples than asked for."""
    if config.run_length is not None:
        requested = dict(zip(SPLIT_NAMES, config.run_length.sizes()))[split]
    else:
        requested = getattr(config, f"{split}_samples")
    return f"{indexed} samples" if not requested else f"{requested} requested, {indexed} indexed (whole epochs)"


def main(argv: Optional[list[str]] = None) -> int:
    """Run `build-indices`; returns the exit code (1 on a bad input, 130 / 143 when interrupted, each
    with one line on stderr; the cache is written under temporary names, so nothing half-built stays)."""
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)

    def command() -> int:
        config = parse_args(argv)
        splits, timings = build_indices(config)
        for split in splits:
            if split is not None:
                logging.getLogger(__name__).info("%s: %s", split.split, _sample_count(config, split.split, len(split)))
        if config.timings:
            print(json.dumps(timings.as_dict()))
        return 0

    return run_command(PROG, command, value_error_exit=EXIT_ERROR)


if __name__ == "__main__":
    sys.exit(main())
