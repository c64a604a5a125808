"""`plot-metrics`: pictures of training runs from their metrics.jsonl (needs matplotlib: tokenmill[plot]).

    plot-metrics runs/gpt-tiny                                  # -> metrics.png
    plot-metrics runs/tp2 runs/pp2 --out compare.svg            # two runs overlaid, SVG
    plot-metrics runs/a/metrics.jsonl runs/b --labels seed1 seed2 --x tokens --out loss.png
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections import Counter

from indexed_dataset.cli_parser import CommandParser
from indexed_dataset.cli_support import run_command

from trainer.metrics.records import read_run
from trainer.metrics.plot import X_AXES, plot_runs

PROG = "plot-metrics"
DEFAULT_OUT = "metrics.png"


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser(prog=PROG, description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", metavar="RUN_DIR|metrics.jsonl",
                        help="a train --save folder (its metrics.jsonl) or a metrics file; several are overlaid")
    parser.add_argument("--out", default=DEFAULT_OUT, metavar="PICTURE",
                        help="the picture to write: .png or .svg")
    parser.add_argument("--x", dest="x_axis", choices=X_AXES, default="iteration",
                        help="x axis: iterations, or consumed tokens")
    parser.add_argument("--labels", nargs="+", metavar="NAME",
                        help="the runs' names in the legend, one per run (default: their folders' names)")
    parser.add_argument("--title", help="the picture's title (default: 'Training metrics: ' and the run names)")
    return parser


def _names(labels: list[str] | None, runs: list) -> list[str]:
    """The legend names: ``labels``, or the runs' own names made unique with their parent folder."""
    if labels is not None:
        return labels
    names = [run.name for run in runs]
    repeated = {name for name, count in Counter(names).items() if count > 1}
    return [f"{run.path.parent.parent.name}/{run.name}" if run.name in repeated else run.name for run in runs]


def main(argv: list[str] | None = None) -> int:
    """Run plot-metrics with ``argv`` (default: sys.argv[1:]); returns the exit code."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)

    def command() -> int:
        if args.labels is not None and len(args.labels) != len(args.runs):
            raise ValueError(f"--labels names {len(args.labels)} runs, but {len(args.runs)} were given")
        runs = [read_run(path) for path in args.runs]
        for run, name in zip(runs, _names(args.labels, runs)):
            run.name = name
        plot_runs(runs, args.out, x_axis=args.x_axis, title=args.title)
        return 0

    return run_command(PROG, command)


if __name__ == "__main__":
    raise SystemExit(main())
