"""`inspect-index`'s training view, the samplers side: its configuration and the sample kinds it can show.

    kind = sample_kind("t5")                 # "gpt": token sequences; "t5": span corruption; "bert": masked LM
    view = kind.module().training_view(data, TrainingViewConfig(sequence_length=512, model="t5"), tokens)
    print(kind.module().format_training_view(view, config))

Each kind is a module `samplers.<kind>.view` with `training_view(data, config, tokens) -> list[dict | None]`
(one JSON-ready entry per split, None for an absent split) and `format_training_view(view, config) -> str`.
A kind's module is imported on first use (T5's and BERT's load torch). The view never sees a tokenizer class:
the caller hands it a `ViewTokens` (decode, and on demand a `ViewVocabulary`: the run's vocabulary as names
and roles), so this room needs no tokenizer code and the caller no kind's conventions.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import ModuleType

from .splits import DEFAULT_SPLIT, SPLIT_NAMES, check_split_sizes

# Megatron's `--seed` default.
DEFAULT_SEED = 1234
# Megatron's T5 defaults: `--decoder-seq-length 128`, `--vocab-extra-ids 100`.
DEFAULT_DECODER_SEQ_LENGTH = 128
DEFAULT_VOCAB_EXTRA_IDS = 100
# Megatron's BERT default: `--mask-prob 0.15`.
DEFAULT_MASK_PROB = 0.15


@dataclass(frozen=True)
class SampleKind:
    """One kind of training sample `inspect-index` can show."""

    name: str
    """The `--model` value that selects it."""
    module_name: str
    """Its view module (see the module docstring), imported on first use."""
    blends: bool
    """Whether its runs train on a blend of datasets (`--data-path` without a dataset path)."""
    tokenizer_use: str | None
    """Why its view needs the run's tokenizer (for the message when none is given); None: it does not."""

    def module(self) -> ModuleType:
        """The kind's view module."""
        return importlib.import_module(self.module_name)


SAMPLE_KINDS = {kind.name: kind for kind in (
    SampleKind("gpt", "samplers.gpt.view", blends=True, tokenizer_use=None),
    SampleKind("t5", "samplers.t5.view", blends=False, tokenizer_use="its pad, EOS and sentinel ids"),
    SampleKind("bert", "samplers.bert.view", blends=False,
               tokenizer_use="its WordPiece pieces: [CLS], [SEP], [MASK], [PAD] and the ## continuations"),
)}


def sample_kind(name: str) -> SampleKind:
    """The registered kind `name`.

    Raises:
        ValueError: no kind has that name.
    """
    if name not in SAMPLE_KINDS:
        raise ValueError(f"model must be one of {', '.join(SAMPLE_KINDS)}, got {name!r}")
    return SAMPLE_KINDS[name]


@dataclass(frozen=True)
class ViewVocabulary:
    """The run's vocabulary as the training view sees it: token names and special roles, no tokenizer code."""

    size: int
    """Ids are < size: the tokenizer's own, then the tokens the run appends (Megatron's [BOS]/[EOS], sentinels)."""
    names: Mapping[str, int]
    """Piece (token name) -> id of every named token: the tokenizer's pieces where it lists them, and every
    appended token (sentinel k as `<extra_id_k>`)."""
    roles: Mapping[str, int]
    """Role -> id of the special tokens the tokenizer defines: "pad", "eos", "decoder_start"."""

    def role(self, name: str) -> int:
        """The id of special role `name`.

        Raises:
            ValueError: the vocabulary has no such token.
        """
        if name not in self.roles:
            raise ValueError(f"the tokenizer has no {name} token")
        return self.roles[name]

    def numbered(self, pattern: str) -> tuple[int, ...]:
        """Ids of `pattern.format(0)`, `pattern.format(1)`, ... while the vocabulary names them (sentinels)."""
        ids: list[int] = []
        while pattern.format(len(ids)) in self.names:
            ids.append(self.names[pattern.format(len(ids))])
        return tuple(ids)


@dataclass(frozen=True)
class ViewTokens:
    """What a training view takes of the run's tokenizer."""

    decode: Callable[[list[int]], str]
    """Token ids -> text."""
    vocabulary: Callable[[int], ViewVocabulary]
    """`vocab_extra_ids` (sentinels appended to a vocabulary without any) -> the run's vocabulary; called only
    by the kinds that need it (it may refuse a tokenizer without a known special-token convention)."""


@dataclass(kw_only=True, slots=True, frozen=True)
class TrainingViewConfig:
    """The sampling configuration to show (Megatron's flag names)."""

    sequence_length: int
    """Tokens per sample (`--seq-length`; T5: encoder positions)."""
    model: str = "gpt"
    """Sample kind to show: one of `SAMPLE_KINDS` (t5: span corruption on a sentence-split dataset)."""
    decoder_sequence_length: int = DEFAULT_DECODER_SEQ_LENGTH
    """T5: decoder positions (`--decoder-seq-length`)."""
    vocab_extra_ids: int = DEFAULT_VOCAB_EXTRA_IDS
    """T5: sentinels added to a vocabulary that has none (`--vocab-extra-ids`)."""
    binary_head: bool = True
    """BERT: sentence-order samples, two segments swapped half the time (`--bert-no-binary-head` turns it off)."""
    mask_prob: float = DEFAULT_MASK_PROB
    """BERT: fraction of a sample's tokens masked (`--mask-prob`)."""
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
        sample_kind(self.model)
        if any(size is not None and size < 0 for size in self.sizes):
            raise ValueError(f"sample counts must be >= 0, got {list(self.sizes)}")
        check_split_sizes(self.split, self.sizes)



def format_view_splits(title: str, view: list[dict | None], render_sample: Callable[[str, int, dict], str]) -> str:
    """The text of a sentence-sample training view (T5, BERT): ``title``, then per split its document range and
    sample count ("absent" for a missing split) followed by ``render_sample(split name, sample id, sample)``
    for each sample shown. ``view``: one entry per split name, as the kinds' ``training_view`` returns it."""
    lines = [title]
    for name, split in zip(SPLIT_NAMES, view):
        if split is None:
            lines.append(f"{name:<16}absent")
            continue
        begin, end = split["document_range"]
        lines.append(f"{name:<16}documents [{begin}, {end}), {split['num_samples']} samples")
        lines.extend(render_sample(name, sample_id, sample) for sample_id, sample in split["samples"].items())
    return "\n".join(lines)
