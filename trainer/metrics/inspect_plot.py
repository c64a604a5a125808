"""`inspect-index --plot`: document lengths, token frequencies and (training view) the split layout as a picture.

    from trainer.metrics.inspect_plot import dataset_histograms, plot_dataset, split_layouts
    lengths, frequencies = dataset_histograms("out/corpus_text_document")
    plot_dataset(lengths, frequencies, "corpus.png", title="out/corpus_text_document")
    plot_dataset(lengths, frequencies, "corpus.png", layouts=split_layouts(view, 2048))  # + training view

The drawing functions take plain arrays and `SplitLayout` records, not readers or configs; the training
view comes in as the JSON-ready list the sample kinds' `samplers.<kind>.view.training_view` return (read by
its keys, never by the kind's name). Panels:

- document lengths: a histogram over logarithmic bins, both axes logarithmic (corpora hold a few very long
  documents and many short ones; empty documents are counted in the title);
- token frequencies: how many vocabulary ids occur n times, logarithmic bins and axes (the long Zipf tail
  at n = 1..10 is where a wrong tokenizer shows), beside the rank/frequency curve;
- the training view: which sequences (T5: documents) each split owns, and how each split's samples are
  made of epochs (the epochs shuffled together, and a last partial epoch shuffled apart when Megatron's
  80% rule separates it).
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from indexed_dataset import open_reader
from indexed_dataset.figures import new_figure, save_figure
from indexed_dataset.inspect import SCAN_DOCUMENTS, document_token_counts

logger = logging.getLogger(__name__)

# Logarithmic histogram bins per factor of 10: fine enough to see a shape, coarse enough for 200 documents.
BINS_PER_DECADE = 8
FIGURE_WIDTH_INCHES = 12.0
HISTOGRAM_ROW_INCHES = 3.6
# The layout panels: axes, title and labels, plus one bar row per dataset (top) or per split (bottom).
LAYOUT_PANEL_INCHES = 1.2
LAYOUT_ROW_INCHES = 0.5
SPLIT_COLOURS = {"train": "tab:blue", "valid": "tab:orange", "test": "tab:green"}
# Megatron's GPT samples take seq_length + 1 tokens and overlap by one (`add_extra_token`): E epochs of T
# tokens give (E x T - 1) // L samples.
EXTRA_TOKEN = 1


@dataclass(frozen=True, slots=True)
class SplitLayout:
    """What one split of one dataset holds, for the training-view panels."""

    dataset: str
    """The dataset's path (a blend shows one row per member)."""
    split: str
    """train, valid or test."""
    unit_range: tuple[int, int]
    """[begin, end) of the split in ``unit``s of the dataset."""
    unit: str
    """What the range counts: "sequences" (GPT) or "documents" (T5)."""
    num_samples: int
    """Samples training takes from the split (the first ones of its index)."""
    num_indexed: int | None = None
    """Samples the split's index holds, when more than training takes (whole epochs are indexed)."""
    num_epochs: int | None = None
    """Epochs of the split the samples come from (None: not known, T5)."""
    samples_shuffled_apart: int = 0
    """Samples of the last epoch when it is shuffled apart from the others (0: all shuffled together)."""
    final_epoch_fraction: float | None = None
    """Share of the last epoch's samples used when it is shuffled apart."""


def _split_layout(dataset: str, split: dict, sequence_length: int, wanted: int | None = None) -> SplitLayout:
    """One dataset's split of a training view as a SplitLayout: a ``sequence_range`` split (token
    sequences, with epochs) or a ``document_range`` split (span corruption: documents, samples).
    ``wanted``: the samples training asks of it (None: all its index holds)."""
    if "document_range" in split:
        return SplitLayout(dataset=dataset, split=split["split"], unit_range=tuple(split["document_range"]),
                           unit="documents", num_samples=split["num_samples"])
    epochs, tokens, indexed = split["num_epochs"], split["num_tokens_per_epoch"], split["num_samples"]
    used = indexed if wanted is None else min(wanted, indexed)
    apart, fraction = 0, None
    if split["separate_final_epoch"]:
        # samplers' `separate_final_epoch` rule, read back: the samples of the first E - 1 epochs come first,
        # then those of the last epoch, of which training takes what it still needs.
        together = ((epochs - 1) * tokens - EXTRA_TOKEN) // sequence_length
        apart = max(0, used - together)
        per_epoch = (tokens - EXTRA_TOKEN) // sequence_length
        # The sample that straddles the epoch boundaries counts in the last epoch: cap the share at 100%.
        fraction = min(1.0, apart / per_epoch) if per_epoch > 0 else None
    return SplitLayout(dataset=dataset, split=split["split"], unit_range=tuple(split["sequence_range"]),
                       unit="sequences", num_samples=used, num_indexed=indexed if indexed != used else None,
                       num_epochs=epochs, samples_shuffled_apart=apart, final_epoch_fraction=fraction)


def split_layouts(view: Sequence[dict | None], sequence_length: int, dataset: str = "",
                  wanted: Sequence[int | None] = ()) -> list[SplitLayout]:
    """The layouts of a training view (`samplers.<kind>.view.training_view`'s list; one dataset or a blend).

    Args:
        view: one entry per split (None when absent); a blended split lists its ``members``.
        sequence_length: tokens per sample (``--seq-length``; used for token-sequence splits).
        dataset: the name shown for a single dataset (a blend's members carry their paths).
        wanted: samples training asks of each split, in the view's order (the view's `sizes`; None or
            missing: all the split's index holds). A blend member shows its own index.
    """
    layouts = []
    for position, split in enumerate(view):
        if split is None:
            continue
        if "members" in split:
            # A member is named with its weight: one path may appear twice in a blend.
            layouts += [_split_layout(f"{member['path']} (weight {member['weight']:.2f})", member, sequence_length)
                        for member in split["members"] if member is not None]
        else:
            size = wanted[position] if position < len(wanted) else None
            layouts.append(_split_layout(dataset, split, sequence_length, size))
    return layouts


def dataset_histograms(path: str) -> tuple[np.ndarray, np.ndarray]:
    """Tokens per document (int64 [D]) and occurrences of each token id (int64 [max id + 1]).

    Reads every token once, in blocks of `SCAN_DOCUMENTS` documents (bounded memory).

    Raises:
        TokenmillError: a missing or damaged dataset (the readers check it on open).
    """
    dataset = open_reader(path)
    frequencies = np.zeros(0, dtype=np.int64)
    for first in range(0, dataset.num_documents, SCAN_DOCUMENTS):
        tokens = dataset.read_documents(first, min(first + SCAN_DOCUMENTS, dataset.num_documents)).tokens
        if len(tokens):
            counts = np.bincount(tokens.astype(np.int64, copy=False))
            if len(counts) > len(frequencies):
                frequencies = np.pad(frequencies, (0, len(counts) - len(frequencies)))
            frequencies[:len(counts)] += counts
    return document_token_counts(dataset), frequencies


def _log_bins(values: np.ndarray) -> np.ndarray:
    """Logarithmic bin edges from 1 to past the largest value, `BINS_PER_DECADE` per factor of 10."""
    top = max(float(values.max()), 1.0) * 1.0001
    decades = max(math.log10(top), 1 / BINS_PER_DECADE)
    return np.logspace(0, decades, max(2, math.ceil(decades * BINS_PER_DECADE) + 1))


def _draw_log_histogram(axes, values: np.ndarray, colour: str, title: str, xlabel: str, ylabel: str) -> None:
    positive = values[values > 0]
    if len(positive):
        axes.hist(positive, bins=_log_bins(positive), color=colour, edgecolor="white", linewidth=0.5)
        axes.set_xscale("log")
        axes.set_yscale("log")
    else:
        axes.text(0.5, 0.5, "nothing to show", ha="center", va="center", transform=axes.transAxes)
    axes.set_title(title, fontsize=11)
    axes.set_xlabel(xlabel)
    axes.set_ylabel(ylabel)
    axes.grid(True, which="major", alpha=0.3)


def _draw_rank_frequency(axes, frequencies: np.ndarray) -> None:
    ranked = np.sort(frequencies[frequencies > 0])[::-1]
    if len(ranked):
        axes.loglog(np.arange(1, len(ranked) + 1), ranked, color="tab:purple", linewidth=1.5)
    axes.set_title(f"Rank / frequency ({len(ranked):,} distinct ids)", fontsize=11)
    axes.set_xlabel("rank of the token id (most frequent = 1)")
    axes.set_ylabel("occurrences")
    axes.grid(True, which="major", alpha=0.3)


def _layout_caption(layout: SplitLayout) -> str:
    begin, end = layout.unit_range
    text = f"{layout.split}: {layout.unit} [{begin:,}, {end:,}), {layout.num_samples:,} samples"
    if layout.num_indexed is not None:
        text += f" (of {layout.num_indexed:,} indexed)"
    if layout.num_epochs is None:
        return text
    together = layout.num_epochs - (1 if layout.samples_shuffled_apart else 0)
    text += (" = 1 epoch, shuffled" if together == 1 and not layout.samples_shuffled_apart
             else f" = {together} epoch{'s' if together != 1 else ''} shuffled together")
    if layout.samples_shuffled_apart:
        share = f" ({100 * layout.final_epoch_fraction:.0f}% of it)" if layout.final_epoch_fraction else ""
        text += f" + epoch {layout.num_epochs}{share} shuffled apart, last"
    return text


def _draw_layout(ranges_axes, samples_axes, layouts: Sequence[SplitLayout]) -> None:
    """Top: each dataset's units coloured by split. Bottom: each split's samples (100% = its count)."""
    datasets = list(dict.fromkeys(layout.dataset for layout in layouts))
    unit = layouts[0].unit
    for row, dataset in enumerate(datasets):
        for layout in (layout for layout in layouts if layout.dataset == dataset):
            begin, end = layout.unit_range
            ranges_axes.barh(row, end - begin, left=begin, color=SPLIT_COLOURS.get(layout.split, "grey"),
                             edgecolor="white", label=layout.split)
    ranges_axes.set_yticks(range(len(datasets)), [os.path.basename(name) or "dataset" for name in datasets])
    ranges_axes.invert_yaxis()
    ranges_axes.set_xlabel(f"{unit} of the dataset")
    ranges_axes.set_title(f"Training view: which {unit} each split owns", fontsize=11)
    handles, labels = ranges_axes.get_legend_handles_labels()
    unique = dict(zip(labels, handles))
    ranges_axes.legend(unique.values(), unique.keys(), loc="center left", bbox_to_anchor=(1.005, 0.5), fontsize=9)
    ranges_axes.set_xlim(0, max(layout.unit_range[1] for layout in layouts))
    for row, layout in enumerate(layouts):
        colour = SPLIT_COLOURS.get(layout.split, "grey")
        apart = 100 * layout.samples_shuffled_apart / layout.num_samples if layout.num_samples else 0.0
        samples_axes.barh(row, 100 - apart, color=colour, edgecolor="white")
        if apart:
            samples_axes.barh(row, apart, left=100 - apart, color=colour, alpha=0.45, hatch="//", edgecolor="white")
        samples_axes.text(1, row, _layout_caption(layout), va="center", fontsize=9, color="black",
                          bbox={"facecolor": "white", "alpha": 0.75, "edgecolor": "none", "pad": 1})
    labels = [layout.split + (f" · {os.path.basename(layout.dataset)}" if len(datasets) > 1 else "")
              for layout in layouts]
    samples_axes.set_yticks(range(len(layouts)), labels)
    samples_axes.invert_yaxis()
    samples_axes.set_xlim(0, 100)
    samples_axes.set_xlabel("share of the split's samples in training order (%); hatched: the last epoch, "
                            "shuffled apart")
    samples_axes.set_title("Training view: epochs behind each split's samples", fontsize=11)


def plot_dataset(document_lengths: np.ndarray | None, token_frequencies: np.ndarray | None,
                 out: str | os.PathLike, title: str = "", layouts: Sequence[SplitLayout] = ()) -> Path:
    """Draw the dataset's histograms (and, given ``layouts``, its training view) into one picture.

    Args:
        document_lengths: int [D], tokens per document (None with ``token_frequencies`` None: only the
            training view, e.g. of a blend of several datasets).
        token_frequencies: int [V], occurrences of each token id.
        out: the picture (.png or .svg); written under a temporary name, then renamed.
        title: the figure's title (the dataset's path).
        layouts: the training view's splits (`split_layouts`); none: no layout.

    Returns:
        The path written.

    Raises:
        FigureError: matplotlib is missing, or ``out`` is neither .png nor .svg.
    """
    if document_lengths is None and not layouts:
        raise ValueError("nothing to draw: no dataset histograms and no training view")
    heights = [HISTOGRAM_ROW_INCHES] if document_lengths is not None else []
    if layouts:
        datasets = len({layout.dataset for layout in layouts})
        heights += [LAYOUT_PANEL_INCHES + LAYOUT_ROW_INCHES * datasets,
                    LAYOUT_PANEL_INCHES + LAYOUT_ROW_INCHES * len(layouts)]
    figure = new_figure(FIGURE_WIDTH_INCHES, 1.0 + sum(heights))
    grid = figure.add_gridspec(len(heights), 3, height_ratios=heights)
    if document_lengths is not None:
        empty = int(np.count_nonzero(document_lengths == 0))
        _draw_log_histogram(figure.add_subplot(grid[0, 0]), document_lengths, "tab:blue",
                            f"Document lengths ({len(document_lengths):,} documents, {empty:,} empty)",
                            "tokens per document (log)", "documents (log)")
        _draw_log_histogram(figure.add_subplot(grid[0, 1]), token_frequencies, "tab:red",
                            f"Token frequencies ({int(token_frequencies.sum()):,} tokens)",
                            "occurrences of a token id (log)", "token ids (log)")
        _draw_rank_frequency(figure.add_subplot(grid[0, 2]), token_frequencies)
    if layouts:
        _draw_layout(figure.add_subplot(grid[-2, :]), figure.add_subplot(grid[-1, :]), layouts)
    if title:
        figure.suptitle(title, fontsize=13)
    written = save_figure(figure, out)
    logger.info("wrote %s", written)
    return written


def plot_inspection(out: str | os.PathLike, path: str | None, view: Sequence[dict | None] | None = None,
                    sequence_length: int = 0, wanted: Sequence[int | None] = ()) -> Path:
    """The picture of one `inspect-index` call: ``path``'s histograms and the training ``view``, if any.

    Args:
        out: the picture (.png or .svg).
        path: the dataset (None: only the training view of a blend).
        view: a sample kind's `training_view` result, or None.
        sequence_length: tokens per sample of the view (``--seq-length``).
        wanted: samples training asks of each split (see `split_layouts`).
    """
    lengths, frequencies = dataset_histograms(path) if path is not None else (None, None)
    layouts = split_layouts(view, sequence_length, path or "", wanted) if view is not None else []
    return plot_dataset(lengths, frequencies, out, title=path or "training view", layouts=layouts)
