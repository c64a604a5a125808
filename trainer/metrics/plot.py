"""Curves of one or several training runs from their `metrics.jsonl`: loss, learning rate, grad norm, ...

    from trainer.metrics.records import read_run
    from trainer.metrics.plot import plot_runs
    plot_runs([read_run("runs/tp2"), read_run("runs/pp2")], "compare.png", x_axis="tokens")

One panel per series the runs' records hold (the panel list is data-driven: a panel whose key no run
has is left out, and a numeric key this module does not know gets a panel of its own, so a later
trainer's MoE aux loss or expert load appears without a change here). Each run has one colour in every
panel; training curves are solid lines, validation points dashed with circles, test points crosses.
The x axis is the iteration, or the consumed tokens (``x_axis="tokens"``).
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from indexed_dataset.errors import TokenmillError
from indexed_dataset.figures import new_figure, save_figure
from indexed_dataset.path_rules import refuse_output_over_inputs

from trainer.metrics.records import SPLIT_KEY, MetricsRun, consumed_tokens

logger = logging.getLogger(__name__)

X_AXES = ("iteration", "tokens")
# Two panels side by side; each panel row is this tall (inches), plus room for the title (top) and
# the legend (bottom).
COLUMNS = 2
FIGURE_WIDTH_INCHES = 12.0
ROW_HEIGHT_INCHES = 3.0
HEADER_HEIGHT_INCHES = 1.0
# tab10: ten colours that stay distinct for colour-blind readers far better than a rainbow.
RUN_COLOURS = "tab10"
EVALUATION_STYLES = {"valid": {"linestyle": "--", "marker": "o"}, "test": {"linestyle": "none", "marker": "X"}}
# Keys that are bookkeeping or x axes, never a panel of their own.
NOT_PLOTTED = frozenset({"iteration", "consumed_samples", "consumed_tokens", "global_batch_size", "train_iters",
                         "ms_per_iteration", "data_ms_per_iteration", SPLIT_KEY})


@dataclass(frozen=True, slots=True)
class Panel:
    """One subplot: a training series (and the evaluation series of the same name, if any)."""

    key: str
    """The record key drawn (training records; evaluation records too when ``evaluations``)."""
    title: str
    ylabel: str
    yscale: str = "linear"
    """matplotlib scale: "linear", "log", or "log2" (log with base 2, for loss scales)."""
    factor: float = 1.0
    """Multiplies every value (MFU 0.42 -> 42 %)."""
    evaluations: bool = False
    """Also draw the evaluation records' ``key``."""
    twin_key: str | None = None
    """A second series on a right-hand axis (skipped iterations beside the loss scale)."""
    twin_label: str = ""
    unless: str | None = None
    """Leave the panel out when this key has values (TFLOP/s only when MFU is unknown)."""
    only_if_varying: bool = False
    """Leave the panel out when every value is the same and the twin series is all zeros (an fp32/bf16 run's
    loss scale is a flat 1.0 and it skips nothing: a panel that says nothing)."""


# The panels we know, in the order shown; keys the runs lack drop out (see `panels_for`).
KNOWN_PANELS = (
    Panel("loss", "Loss (train solid, validation dashed, test crosses)", "LM loss (nats/token)", evaluations=True),
    Panel("perplexity", "Evaluation perplexity (validation dashed, test crosses)", "perplexity (log)", yscale="log",
          evaluations=True),
    Panel("lr", "Learning rate", "learning rate"),
    Panel("grad_norm", "Gradient norm", "global L2 norm (log)", yscale="log"),
    Panel("loss_scale", "Loss scale and skipped steps", "loss scale (log2)", yscale="log2",
          twin_key="skipped_iterations", twin_label="skipped steps (total, dotted)", only_if_varying=True),
    Panel("tokens_per_second", "Throughput", "tokens/s (whole run)"),
    Panel("mfu", "Model FLOPs utilisation", "MFU (% of dense bf16/fp16 peak)", factor=100.0),
    Panel("tflops_per_device", "Model TFLOP/s per device (MFU unknown on this device)", "TFLOP/s",
          unless="mfu"),
    Panel("moe_aux_loss", "MoE auxiliary (load-balancing) loss", "aux loss"),
    Panel("expert_load", "MoE expert load", "share of routed tokens"),
)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _has_values(runs: Sequence[MetricsRun], key: str, evaluations: bool = False) -> bool:
    """Whether any run has a finite number (or a list of them) under ``key``."""
    for run in runs:
        for record in run.train + (run.evaluations if evaluations else []):
            value = record.get(key)
            if _is_number(value) or (isinstance(value, list) and any(map(_is_number, value))):
                return True
    return False


def _varies(runs: Sequence[MetricsRun], panel: Panel) -> bool:
    """Whether ``panel.key`` takes more than one value in some run, or its twin series is ever non-zero."""
    for run in runs:
        if len({record[panel.key] for record in run.train if _is_number(record.get(panel.key))}) > 1:
            return True
        if panel.twin_key and any(_is_number(record.get(panel.twin_key)) and record[panel.twin_key] != 0
                                  for record in run.train):
            return True
    return False


def panels_for(runs: Sequence[MetricsRun]) -> list[Panel]:
    """The panels these runs fill: known ones with values, then one per unknown numeric key."""
    panels = [panel for panel in KNOWN_PANELS
              if _has_values(runs, panel.key, panel.evaluations)
              and not (panel.unless and _has_values(runs, panel.unless))
              and not (panel.only_if_varying and not _varies(runs, panel))]
    known = {panel.key for panel in KNOWN_PANELS} | {panel.twin_key for panel in KNOWN_PANELS} | NOT_PLOTTED
    extra = sorted({key for run in runs for record in run.train for key in record
                    if key not in known and _has_values([run], key)})
    return panels + [Panel(key, key.replace("_", " "), key) for key in extra]


def _x_values(run: MetricsRun, records: list[dict], x_axis: str) -> np.ndarray:
    """float64 [len(records)]: the x of each record (evaluation records get the consumed tokens of
    their iteration, interpolated between the training records around it)."""
    iterations = np.array([record["iteration"] for record in records], dtype=np.float64)
    if x_axis == "iteration":
        return iterations
    known = [(record["iteration"], consumed_tokens(record)) for record in run.train]
    known = [(iteration, tokens) for iteration, tokens in known if tokens is not None]
    if not known:
        raise TokenmillError(f"{run.path}: its records do not give the consumed tokens (no training record "
                             "with consumed_samples, tokens_per_second, ms_per_iteration and global_batch_size); "
                             "plot against iterations instead")
    at, tokens = np.array(known, dtype=np.float64).T
    # Constant batch size: tokens grow linearly with the iteration, also before the first record.
    slope = tokens[-1] / at[-1] if at[-1] else 0.0
    return np.where(iterations < at[0], iterations * slope,
                    np.where(iterations > at[-1], iterations * slope, np.interp(iterations, at, tokens)))


def _series(run: MetricsRun, records: list[dict], key: str, x_axis: str, factor: float):
    """(x, y) float64 arrays of the records holding a finite number under ``key``."""
    kept = [record for record in records if _is_number(record.get(key))]
    if not kept:
        return None
    return _x_values(run, kept, x_axis), np.array([record[key] for record in kept], dtype=np.float64) * factor


def _draw_list_series(axes, run: MetricsRun, key: str, x_axis: str, colour) -> None:
    """A list-valued key (expert load): one thin line per element, in the run's colour."""
    kept = [record for record in run.train if isinstance(record.get(key), list)]
    if not kept:
        return
    width = max(len(record[key]) for record in kept)
    values = np.full((len(kept), width), np.nan)
    for row, record in enumerate(kept):
        values[row, :len(record[key])] = [value if _is_number(value) else np.nan for value in record[key]]
    x = _x_values(run, kept, x_axis)
    for column in range(width):
        axes.plot(x, values[:, column], color=colour, linewidth=0.8, alpha=0.7)


def _draw_panel(axes, panel: Panel, runs: Sequence[MetricsRun], colours: list, x_axis: str) -> None:
    twin = axes.twinx() if panel.twin_key and _has_values(runs, panel.twin_key) else None
    for run, colour in zip(runs, colours):
        if any(isinstance(record.get(panel.key), list) for record in run.train):
            _draw_list_series(axes, run, panel.key, x_axis, colour)
            continue
        train = _series(run, run.train, panel.key, x_axis, panel.factor)
        if train is not None:
            axes.plot(*train, color=colour, linewidth=1.5)
        for split, style in EVALUATION_STYLES.items():
            records = [record for record in run.evaluations if record[SPLIT_KEY] == split]
            series = _series(run, records, panel.key, x_axis, panel.factor) if panel.evaluations else None
            if series is not None:
                axes.plot(*series, color=colour, markersize=5, linewidth=1.2, **style)
        if twin is not None:
            skipped = _series(run, run.train, panel.twin_key, x_axis, 1.0)
            if skipped is not None:
                twin.step(*skipped, where="post", color=colour, linestyle=":", linewidth=1.2)
    if panel.yscale == "log2":
        axes.set_yscale("log", base=2)
    else:
        axes.set_yscale(panel.yscale)
    if twin is not None:
        twin.set_ylabel(panel.twin_label)
        # Whole steps; an axis up to 1 at least, so a run that skipped nothing shows a flat line at 0.
        twin.yaxis.get_major_locator().set_params(integer=True)
        twin.set_ylim(0, max(1.0, twin.get_ylim()[1]))
    axes.set_title(panel.title, fontsize=11)
    axes.set_ylabel(panel.ylabel)
    axes.grid(True, which="major", alpha=0.3)


def _legend_handles(runs: Sequence[MetricsRun], colours: list) -> list:
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], color=colour, linewidth=2.5, label=run.name) for run, colour in zip(runs, colours)]
    handles.append(Line2D([], [], color="grey", linewidth=1.5, label="train"))
    splits = {record[SPLIT_KEY] for run in runs for record in run.evaluations}
    handles += [Line2D([], [], color="grey", label=split, **style)
                for split, style in EVALUATION_STYLES.items() if split in splits]
    return handles


def plot_runs(runs: Sequence[MetricsRun], out: str | os.PathLike, x_axis: str = "iteration",
              title: str | None = None) -> Path:
    """Draw the runs' panels into one picture (PNG or SVG by the suffix of ``out``).

    Args:
        runs: the runs to overlay, each in its own colour and named in the legend.
        out: the picture to write (its folder is created; written under a temporary name, then renamed).
        x_axis: "iteration" or "tokens" (consumed tokens).
        title: the figure's title; default names the runs.

    Returns:
        The path written.

    Raises:
        TokenmillError: no run has any plottable value, ``out`` is one of the metrics files, or
            (``x_axis="tokens"``) a run's records do not give the consumed tokens; FigureError: matplotlib is missing or ``out`` is not .png/.svg.
    """
    if x_axis not in X_AXES:
        raise ValueError(f"x_axis must be one of {', '.join(X_AXES)}, got {x_axis!r}")
    refuse_output_over_inputs([out], [run.path for run in runs])
    panels = panels_for(runs)
    if not panels:
        raise TokenmillError(f"nothing to plot: {', '.join(str(run.path) for run in runs)} hold no numeric series")
    rows = math.ceil(len(panels) / COLUMNS)
    figure = new_figure(FIGURE_WIDTH_INCHES, HEADER_HEIGHT_INCHES + ROW_HEIGHT_INCHES * rows)
    from matplotlib import colormaps
    from matplotlib.ticker import EngFormatter

    palette = colormaps[RUN_COLOURS]
    colours = [palette(index % palette.N) for index in range(len(runs))]
    grid = figure.subplots(rows, COLUMNS, squeeze=False, sharex=True)
    for axes, panel in zip(grid.flat, panels):
        _draw_panel(axes, panel, runs, colours, x_axis)
    for axes in grid.flat[len(panels):]:
        axes.set_visible(False)
    for axes in grid.flat[:len(panels)]:
        if x_axis == "tokens":
            axes.xaxis.set_major_formatter(EngFormatter(sep=""))
        axes.xaxis.set_tick_params(labelbottom=True)  # sharex hides them on all but the last row
        axes.set_xlabel("consumed tokens" if x_axis == "tokens" else "iteration")
    figure.suptitle(title or "Training metrics: " + ", ".join(run.name for run in runs), fontsize=13)
    figure.legend(handles=_legend_handles(runs, colours), loc="outside lower center",
                  ncol=min(len(runs) + 3, 8), frameon=False)
    written = save_figure(figure, out)
    logger.info("wrote %s: %d panels, %d run(s), x = %s", written, len(panels), len(runs), x_axis)
    return written
