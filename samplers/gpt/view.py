"""The GPT sample kind of `inspect-index`'s training view: epochs, sample counts and chosen token sequences of
each split of one dataset or a blend, as plain dicts and as text (see `samplers.view`)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..splits import SPLIT_NAMES, parse_blend
from ..view import TrainingViewConfig, ViewTokens
from .inspect import SplitInspection, inspect_blend_splits


def _sample_dict(tokens: np.ndarray, view_tokens: ViewTokens | None) -> dict:
    sample: dict = {"tokens": tokens.tolist()}
    if view_tokens is not None:
        sample["text"] = view_tokens.decode(tokens[tokens >= 0].tolist())
    return sample


def _split_dict(inspection: SplitInspection, view_tokens: ViewTokens | None) -> dict:
    """A `SplitInspection` as a JSON-ready dict."""
    return {
        "split": inspection.split,
        "sequence_range": list(inspection.sequence_range),
        "num_tokens_per_epoch": inspection.num_tokens_per_epoch,
        "num_epochs": inspection.num_epochs,
        "separate_final_epoch": inspection.separate_final_epoch,
        "num_samples": inspection.num_samples,
        "samples": {i: _sample_dict(tokens, view_tokens) for i, tokens in inspection.samples.items()},
    }


def training_view(data: str | Sequence[str], config: TrainingViewConfig,
                  view_tokens: ViewTokens | None = None) -> list[dict | None]:
    """Epochs, sample counts and chosen samples of each split, as plain dicts (JSON-ready).

    Args:
        data: one dataset path (any format), or blend words as `train --data-path` takes them
            ("A B" or "0.3 A 0.7 B").
        config: the sampling configuration.
        view_tokens: decodes the samples when given (pad ids, -1, are left out of the text).

    Returns:
        One entry per split (train, valid, test): None for an absent split; for one dataset's split a
        dict with `split`, `sequence_range`, `num_tokens_per_epoch`, `num_epochs`, `separate_final_epoch`,
        `num_samples` and `samples` ({sample id: {"tokens": [...], "text": str (with a tokenizer)}}); for a
        blended split a dict with `split`, `num_samples`, `members` (per member: `path`, `weight` and the
        fields above but `samples`, or None when the split never draws from it) and `samples` (each also
        naming its `member`).

    Raises:
        TokenmillError: damaged dataset, malformed split or blend, or samples asked of an empty split.
    """
    blend = ([data], None) if isinstance(data, str) else parse_blend(list(data))
    report = inspect_blend_splits(blend, config.sequence_length, config.split, config.seed, sizes=config.sizes,
                                  sample_ids=config.sample_ids, path_to_cache=config.path_to_cache)
    view: list[dict | None] = []
    for inspection in report:
        if inspection is None or isinstance(inspection, SplitInspection):
            view.append(None if inspection is None else _split_dict(inspection, view_tokens))
            continue
        members = []
        for path, weight, member in zip(blend[0], inspection.weights, inspection.members):
            members.append(None if member is None else {"path": path, "weight": weight,
                                                         **{k: v for k, v in _split_dict(member, None).items()
                                                            if k != "samples"}})
        samples = {i: {"member": member, **_sample_dict(tokens, view_tokens)}
                   for i, (member, tokens) in inspection.samples.items()}
        view.append({"split": inspection.split, "num_samples": inspection.num_samples, "members": members,
                     "samples": samples})
    return view


def format_training_view(view: list[dict | None], config: TrainingViewConfig) -> str:
    """The text `inspect-index` prints for a training view."""
    lines = [f"training view   seq-length {config.sequence_length}, split {config.split}, seed {config.seed}"]
    for name, split, wanted in zip(SPLIT_NAMES, view, config.sizes):
        if split is None:
            lines.append(f"{name:<16}absent")
            continue
        if "members" in split:
            lines.append(f"{name:<16}blend of {len(split['members'])} datasets, {split['num_samples']} samples")
            for member in split["members"]:
                if member is not None:
                    lines.append(f"  {member['weight']:.4f} {member['path']}: {_split_summary(member)}")
        else:
            lines.append(f"{name:<16}{_split_summary(split, wanted)}")
        for sample_id, sample in split["samples"].items():
            shown = sample["text"] if "text" in sample else " ".join(map(str, sample["tokens"]))
            source = f" (member {sample['member']})" if "member" in sample else ""
            lines.append(f"--- {name} sample {sample_id}{source} ---\n{shown}")
    return "\n".join(lines)


def _split_summary(split: dict, wanted: int | None = None) -> str:
    """"sequences [b, e), T tokens per epoch, E epochs, N samples" of one dataset's split; with a requested
    size ``wanted``, "R requested, N indexed (whole epochs)": the index covers whole epochs."""
    begin, end = split["sequence_range"]
    shuffled_apart = " (last one shuffled apart)" if split["separate_final_epoch"] else ""
    return (f"sequences [{begin}, {end}), {split['num_tokens_per_epoch']} tokens per epoch, "
            f"{split['num_epochs']} {'epoch' if split['num_epochs'] == 1 else 'epochs'}{shuffled_apart}, "
            + (f"{split['num_samples']} samples" if not wanted
               else f"{wanted} requested, {split['num_samples']} indexed (whole epochs)"))
