"""The training view of `inspect-index`: what a GPT or T5 run with a sequence length, split and seed will see.

    inspect-index data/corpus_text_document --seq-length 2048 --split 949,50,1 --seed 1234 \
        --train-samples 100000 --samples 0,1,-1 --tokenizer-type GPT2BPETokenizer ...
    inspect-index --data-path 0.3 data/a_text_document 0.7 data/b_arrow --seq-length 2048 --train-samples 100000
    inspect-index data/corpus_text_sentence --model t5 --seq-length 512 --decoder-seq-length 128 \
        --vocab-extra-ids 100 --tokenizer-type GPTSentencePieceTokenizer --tokenizer-model spiece.model

This is the one place the `preprocess` room reaches up into `samplers`: the user-facing inspect
command shows the training view, while the index math (splits, epochs, shuffles) stays in
`samplers.inspect.inspect_splits` (T5: `samplers.t5_dataset.inspect_t5_splits`). `samplers` is
imported inside the view functions only, so the rest
of the room (and `preprocess-data`) never loads it.

The index cache is the one training uses: `--data-cache-path` when given, else `index-cache/` beside
the data (what `train` and `build-indices` default to), so inspecting pre-builds the indices a later
run loads, and a run's `--data-cache-path` shows exactly its own indices. Where that directory is not
writable the indices are built in memory (samplers' rule).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

# The split names and default are samplers' (one definition for train, build-indices and inspect-index);
# `samplers.splits` is light: the index kernels load only inside the view functions.
from samplers.splits import DEFAULT_SPLIT, SPLIT_NAMES

from .tokenizers import Tokenizer
from .tokenizers.t5 import t5_special_ids

# Megatron's `--seed` default.
DEFAULT_SEED = 1234
MODEL_KINDS = ("gpt", "t5")
# Megatron's T5 defaults: `--decoder-seq-length 128`, `--vocab-extra-ids 100`.
DEFAULT_DECODER_SEQ_LENGTH = 128
DEFAULT_VOCAB_EXTRA_IDS = 100


@dataclass(kw_only=True, slots=True, frozen=True)
class TrainingViewConfig:
    """The sampling configuration to show (Megatron's flag names)."""

    sequence_length: int
    """Tokens per sample (`--seq-length`; T5: encoder positions)."""
    model: str = "gpt"
    """Model kind whose samples to show: gpt or t5 (span corruption on a sentence-split dataset)."""
    decoder_sequence_length: int = DEFAULT_DECODER_SEQ_LENGTH
    """T5: decoder positions (`--decoder-seq-length`)."""
    vocab_extra_ids: int = DEFAULT_VOCAB_EXTRA_IDS
    """T5: sentinels added to a vocabulary that has none (`--vocab-extra-ids`)."""
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
        if self.model not in MODEL_KINDS:
            raise ValueError(f"model must be one of {', '.join(MODEL_KINDS)}, got {self.model!r}")
        if any(size is not None and size < 0 for size in self.sizes):
            raise ValueError(f"sample counts must be >= 0, got {list(self.sizes)}")


def _sample_dict(tokens, tokenizer: Tokenizer | None) -> dict:
    sample: dict = {"tokens": tokens.tolist()}
    if tokenizer is not None:
        sample["text"] = tokenizer.decode(tokens[tokens >= 0].tolist())
    return sample


def _split_dict(inspection, tokenizer: Tokenizer | None) -> dict:
    """A `samplers.inspect.SplitInspection` as a JSON-ready dict."""
    return {
        "split": inspection.split,
        "sequence_range": list(inspection.sequence_range),
        "num_tokens_per_epoch": inspection.num_tokens_per_epoch,
        "num_epochs": inspection.num_epochs,
        "separate_final_epoch": inspection.separate_final_epoch,
        "num_samples": inspection.num_samples,
        "samples": {i: _sample_dict(tokens, tokenizer) for i, tokens in inspection.samples.items()},
    }


def training_view(data: str | Sequence[str], config: TrainingViewConfig,
                  tokenizer: Tokenizer | None = None) -> list[dict | None]:
    """Epochs, sample counts and chosen samples of each split, as plain dicts (JSON-ready).

    Args:
        data: one dataset path (any format), or blend words as `train --data-path` takes them
            ("A B" or "0.3 A 0.7 B").
        config: the sampling configuration.
        tokenizer: decodes the samples when given (pad ids, -1, are left out of the text).

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
    # The training view only: see the module docstring.
    from samplers.inspect import SplitInspection, inspect_blend_splits
    from samplers.splits import parse_blend

    blend = ([data], None) if isinstance(data, str) else parse_blend(list(data))
    report = inspect_blend_splits(blend, config.sequence_length, config.split, config.seed, sizes=config.sizes,
                                  sample_ids=config.sample_ids, path_to_cache=config.path_to_cache)
    view: list[dict | None] = []
    for inspection in report:
        if inspection is None or isinstance(inspection, SplitInspection):
            view.append(None if inspection is None else _split_dict(inspection, tokenizer))
            continue
        members = []
        for path, weight, member in zip(blend[0], inspection.weights, inspection.members):
            members.append(None if member is None else {"path": path, "weight": weight,
                                                         **{k: v for k, v in _split_dict(member, None).items()
                                                            if k != "samples"}})
        samples = {i: {"member": member, **_sample_dict(tokens, tokenizer)}
                   for i, (member, tokens) in inspection.samples.items()}
        view.append({"split": inspection.split, "num_samples": inspection.num_samples, "members": members,
                     "samples": samples})
    return view


def format_training_view(view: list[dict | None], config: TrainingViewConfig) -> str:
    """The text `inspect-index` prints for a training view."""
    lines = [f"training view   seq-length {config.sequence_length}, split {config.split}, seed {config.seed}"]
    for name, split in zip(SPLIT_NAMES, view):
        if split is None:
            lines.append(f"{name:<16}absent")
            continue
        if "members" in split:
            lines.append(f"{name:<16}blend of {len(split['members'])} datasets, {split['num_samples']} samples")
            for member in split["members"]:
                if member is not None:
                    lines.append(f"  {member['weight']:.4f} {member['path']}: {_split_summary(member)}")
        else:
            lines.append(f"{name:<16}{_split_summary(split)}")
        for sample_id, sample in split["samples"].items():
            shown = sample["text"] if "text" in sample else " ".join(map(str, sample["tokens"]))
            source = f" (member {sample['member']})" if "member" in sample else ""
            lines.append(f"--- {name} sample {sample_id}{source} ---\n{shown}")
    return "\n".join(lines)


def _split_summary(split: dict) -> str:
    """"sequences [b, e), T tokens per epoch, E epochs, N samples" of one dataset's split."""
    begin, end = split["sequence_range"]
    shuffled_apart = " (last one shuffled apart)" if split["separate_final_epoch"] else ""
    return (f"sequences [{begin}, {end}), {split['num_tokens_per_epoch']} tokens per epoch, "
            f"{split['num_epochs']} epochs{shuffled_apart}, {split['num_samples']} samples")


def t5_training_view(prefix: str, config: TrainingViewConfig, tokenizer: Tokenizer,
                     tokenizer_type: str) -> list[dict | None]:
    """What a ``train --model t5`` run sees of each split: sample counts and span-corrupted samples.

    Args:
        prefix: sentence-split dataset prefix.
        config: the sampling configuration (``model`` t5).
        tokenizer: the run's tokenizer (gives the pad, EOS, decoder-start and sentinel ids, and decodes).
        tokenizer_type: its Megatron type name (the sentinel convention depends on it).

    Returns:
        One entry per split: None when absent, else `samplers.t5_dataset.inspect_t5_splits`'s dict
        whose samples also carry ``encoder_text`` and ``target_text`` (sentinels as `<extra_id_k>`).

    Raises:
        TokenmillError: damaged dataset, a tokenizer without a T5 convention, or bad sample options.
        ValueError: sample options the T5 dataset rejects (too short a decoder, too few sentinels).
    """
    from samplers.t5_dataset import T5DatasetConfig, format_t5_ids, inspect_t5_splits

    special = t5_special_ids(tokenizer, tokenizer_type, config.vocab_extra_ids)
    dataset_config = T5DatasetConfig(data_prefix=prefix, sentinel_ids=special.sentinels, pad_id=special.pad,
                                     decoder_start_id=special.decoder_start, eos_id=special.eos, split=config.split,
                                     encoder_seq_length=config.sequence_length,
                                     decoder_seq_length=config.decoder_sequence_length, random_seed=config.seed,
                                     path_to_cache=config.path_to_cache)
    view = inspect_t5_splits(dataset_config, config.sizes, config.sample_ids)
    for split in view:
        for sample in (split["samples"].values() if split is not None else ()):
            sample["encoder_text"] = format_t5_ids(sample["encoder_input"], special.sentinels, tokenizer.decode)
            sample["target_text"] = format_t5_ids(sample["decoder_target"], special.sentinels, tokenizer.decode)
    return view


def format_t5_training_view(view: list[dict | None], config: TrainingViewConfig) -> str:
    """The text `inspect-index --model t5` prints for a T5 training view."""
    lines = [f"training view   t5, encoder {config.sequence_length}, decoder {config.decoder_sequence_length}, "
             f"split {config.split}, seed {config.seed}"]
    for name, split in zip(SPLIT_NAMES, view):
        if split is None:
            lines.append(f"{name:<16}absent")
            continue
        begin, end = split["document_range"]
        lines.append(f"{name:<16}documents [{begin}, {end}), {split['num_samples']} samples")
        for sample_id, sample in split["samples"].items():
            lines.append(f"--- {name} sample {sample_id} ---\ninput:  {sample['encoder_text']}\n"
                         f"target: {sample['target_text']}")
    return "\n".join(lines)
