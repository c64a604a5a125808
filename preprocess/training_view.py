"""The training view of `inspect-index`: what a GPT run with a sequence length, split and seed will see.

    inspect-index data/corpus_text_document --seq-length 2048 --split 949,50,1 --seed 1234 \
        --train-samples 100000 --samples 0,1,-1 --tokenizer-type GPT2BPETokenizer ...

This is the one place the `preprocess` room reaches up into `samplers`: the user-facing inspect
command shows the training view, while the index math (splits, epochs, shuffles) stays in
`samplers.inspect.inspect_splits`. `samplers` is imported inside `training_view` only, so the rest
of the room (and `preprocess-data`) never loads it.

The index cache is the one training uses: `--data-cache-path` when given, else `index-cache/` beside
the data (what `train` and `build-indices` default to), so inspecting pre-builds the indices a later
run loads, and a run's `--data-cache-path` shows exactly its own indices. Where that directory is not
writable the indices are built in memory (samplers' rule).
"""

from __future__ import annotations

from dataclasses import dataclass

from .tokenizers import Tokenizer

SPLIT_NAMES = ("train", "valid", "test")
# Megatron's `--split` default.
DEFAULT_SPLIT = "969,30,1"
# Megatron's `--seed` default.
DEFAULT_SEED = 1234


@dataclass(kw_only=True, slots=True, frozen=True)
class TrainingViewConfig:
    """The sampling configuration to show (Megatron's flag names)."""

    sequence_length: int
    """Tokens per sample (`--seq-length`)."""
    split: str = DEFAULT_SPLIT
    """Split weights such as "949,50,1"."""
    seed: int = DEFAULT_SEED
    """Seed of the shuffles."""
    sizes: tuple[int | None, int | None, int | None] = (None, None, None)
    """Samples wanted per split (None: one epoch), as training's train/valid/test sample counts."""
    sample_ids: tuple[int, ...] = (0,)
    """Samples to show (negative counts from the end of a split)."""
    path_to_cache: str | None = None
    """Index cache directory; None: `index-cache/` beside the data, as training."""

    def __post_init__(self) -> None:
        if self.sequence_length < 1:
            raise ValueError(f"sequence length must be >= 1, got {self.sequence_length}")
        if any(size is not None and size < 0 for size in self.sizes):
            raise ValueError(f"sample counts must be >= 0, got {list(self.sizes)}")


def training_view(prefix: str, config: TrainingViewConfig, tokenizer: Tokenizer | None = None) -> list[dict | None]:
    """Epochs, sample counts and chosen samples of each split, as plain dicts (JSON-ready).

    Args:
        prefix: dataset prefix.
        config: the sampling configuration.
        tokenizer: decodes the samples when given (pad ids, -1, are left out of the text).

    Returns:
        One entry per split (train, valid, test): None for an absent split, else a dict with
        `split`, `sequence_range`, `num_tokens_per_epoch`, `num_epochs`, `separate_final_epoch`,
        `num_samples` and `samples` ({sample id: {"tokens": [...], "text": str (with a tokenizer)}}).

    Raises:
        TokenmillError: damaged dataset, malformed split string, or samples asked of an empty split.
    """
    from samplers.inspect import inspect_splits  # the training view only: see the module docstring

    report = inspect_splits(
        prefix,
        config.sequence_length,
        config.split,
        config.seed,
        sizes=config.sizes,
        sample_ids=config.sample_ids,
        path_to_cache=config.path_to_cache,
    )
    view: list[dict | None] = []
    for inspection in report:
        if inspection is None:
            view.append(None)
            continue
        samples = {}
        for sample_id, tokens in inspection.samples.items():
            sample: dict = {"tokens": tokens.tolist()}
            if tokenizer is not None:
                sample["text"] = tokenizer.decode(tokens[tokens >= 0].tolist())
            samples[sample_id] = sample
        view.append({
            "split": inspection.split,
            "sequence_range": list(inspection.sequence_range),
            "num_tokens_per_epoch": inspection.num_tokens_per_epoch,
            "num_epochs": inspection.num_epochs,
            "separate_final_epoch": inspection.separate_final_epoch,
            "num_samples": inspection.num_samples,
            "samples": samples,
        })
    return view


def format_training_view(view: list[dict | None], config: TrainingViewConfig) -> str:
    """The text `inspect-index` prints for a training view."""
    lines = [f"training view   seq-length {config.sequence_length}, split {config.split}, seed {config.seed}"]
    for name, split in zip(SPLIT_NAMES, view):
        if split is None:
            lines.append(f"{name:<16}absent")
            continue
        begin, end = split["sequence_range"]
        lines.append(
            f"{name:<16}sequences [{begin}, {end}), {split['num_tokens_per_epoch']} tokens per epoch, "
            f"{split['num_epochs']} epochs{' (last one shuffled apart)' if split['separate_final_epoch'] else ''}, "
            f"{split['num_samples']} samples"
        )
        for sample_id, sample in split["samples"].items():
            shown = sample["text"] if "text" in sample else " ".join(map(str, sample["tokens"]))
            lines.append(f"--- {name} sample {sample_id} ---\n{shown}")
    return "\n".join(lines)

