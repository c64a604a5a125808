"""Pictures for every room's commands: matplotlib as an optional extra, PNG or SVG by suffix, no half files.

    from indexed_dataset.figures import new_figure, save_figure
    figure = new_figure(width_inches=12, height_inches=6)      # FigureMissingError without matplotlib
    axes = figure.add_subplot(1, 1, 1); axes.plot([1, 2, 3])
    save_figure(figure, "out/loss.png")                        # or .svg

`plot-metrics` (trainer) and `inspect-index --plot` (preprocess) both draw, so the shared part lives in
the lowest room, like the argument parser. Figures are built with `matplotlib.figure.Figure` and the Agg
canvas, never `pyplot`: no global figure state, no display needed, safe in a test process.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from .errors import TokenmillError
from .permissions import give_default_permissions

# The suffixes `save_figure` writes, and the matplotlib format each one means.
FIGURE_FORMATS = {".png": "png", ".svg": "svg"}
# 90 dots per inch: a 12 x 13 inch figure (plot-metrics' seven panels) is a 1080 x 1170 PNG, readable on a
# screen and in a README, and under 200 KB.
FIGURE_DPI = 90
INSTALL_HINT = "pip install 'tokenmill[plot]' (or: pip install matplotlib)"


class FigureError(TokenmillError):
    """A picture cannot be drawn: matplotlib is missing, or the output name has no known suffix."""


def require_matplotlib() -> None:
    """Raise FigureError, with the command to install it, when matplotlib is not installed."""
    try:
        import matplotlib  # noqa: F401  (only its presence is checked)
    except ImportError:
        raise FigureError(f"drawing pictures needs matplotlib: {INSTALL_HINT}") from None


def figure_format(path: str | os.PathLike) -> str:
    """The matplotlib format of ``path`` from its suffix ("png" or "svg").

    Raises:
        FigureError: any other suffix.
    """
    suffix = Path(path).suffix.lower()
    if suffix not in FIGURE_FORMATS:
        raise FigureError(f"{path}: the picture's name must end in {' or '.join(FIGURE_FORMATS)}")
    return FIGURE_FORMATS[suffix]


def new_figure(width_inches: float, height_inches: float) -> Any:
    """An empty `matplotlib.figure.Figure` on the Agg canvas, laid out with constrained layout.

    Raises:
        FigureError: matplotlib is not installed.
    """
    require_matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width_inches, height_inches), dpi=FIGURE_DPI, layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def save_figure(figure: Any, path: str | os.PathLike) -> Path:
    """Write ``figure`` to ``path`` (PNG or SVG by suffix) under a temporary name, then rename it.

    An interrupted or failed write leaves no file that looks complete. The output folder is created.

    Raises:
        FigureError: the suffix is neither .png nor .svg.
        OSError: the folder cannot be written (the message names it).
    """
    fmt = figure_format(path)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(handle, "wb") as stream:
            figure.savefig(stream, format=fmt, dpi=FIGURE_DPI)
        give_default_permissions(temporary)  # mkstemp's file is private (0600)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return path
