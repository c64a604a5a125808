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

from indexed_dataset import TokenmillError

from .prebuild import BuildIndicesConfig, build_indices


class _ArgumentParser(argparse.ArgumentParser):
    """Reports a bad flag as a ValueError, so `main` prints it as its one error line."""

    def error(self, message: str) -> NoReturn:
        raise ValueError(message)


def parse_args(argv: Optional[list[str]]) -> BuildIndicesConfig:
    parser = _ArgumentParser(prog="build-indices", description=__doc__.splitlines()[0])
    parser.add_argument("--data-path", nargs="+", metavar="[WEIGHT] PREFIX", help="datasets, optionally weighted")
    parser.add_argument("--train-data-path", nargs="+", metavar="[WEIGHT] PREFIX", help="train split datasets (used whole)")
    parser.add_argument("--valid-data-path", nargs="+", metavar="[WEIGHT] PREFIX", help="valid split datasets (used whole)")
    parser.add_argument("--test-data-path", nargs="+", metavar="[WEIGHT] PREFIX", help="test split datasets (used whole)")
    parser.add_argument("--split", help="split fractions with --data-path, e.g. 949,50,1 (default 969,30,1)")
    parser.add_argument("--seq-length", type=int, required=True, help="tokens per sample")
    parser.add_argument("--seed", type=int, default=1234, help="random seed of the shuffles (default 1234)")
    for name in ("train", "valid", "test"):
        parser.add_argument(f"--{name}-samples", type=int, help=f"{name} samples (default: one epoch)")
    parser.add_argument("--data-cache-path", help="index cache directory (default: index-cache/ beside the data)")
    parser.add_argument("--dump", metavar="DIR", help="also write every split's arrays under DIR")
    parser.add_argument("--timings", action="store_true", help="print build seconds per phase as one JSON line")
    return BuildIndicesConfig(**vars(parser.parse_args(argv)))


def main(argv: Optional[list[str]] = None) -> int:
    """Run `build-indices`; returns the exit code (1 on a bad input, with one line on stderr)."""
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    try:
        config = parse_args(argv)
        splits, timings = build_indices(config)
    except (TokenmillError, ValueError, OSError) as error:
        print(f"build-indices: error: {error}", file=sys.stderr)
        return 1
    for split in splits:
        if split is not None:
            logging.getLogger(__name__).info("%s: %d samples", split.split, len(split))
    if config.timings:
        print(json.dumps(timings.as_dict()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
