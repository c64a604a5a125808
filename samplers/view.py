"""`inspect-index`'s training view, the samplers side: its configuration and the sample kinds it can show.

    kind = sample_kind("t5")                 # "gpt": token sequences; "t5": span corruption
    view = kind.module().training_view(data, TrainingViewConfig(sequence_length=512, model="t5"), tokens)
    print(kind.module().format_training_view(view, config))

Each kind is a module `samplers.<kind>.view` with `training_view(data, config, tokens) -> list[dict | None]`
(one JSON-ready entry per split, None for an absent split) and `format_training_view(view, config) -> str`.
A kind's module is imported on first use (T5's loads torch). The view never sees a tokenizer class: the
caller hands it a `ViewTokens` (decode, and the special ids on demand), so this room needs no tokenizer code.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Protocol

from .splits import DEFAULT_SPLIT

# Megatron's `--seed` default.
DEFAULT_SEED = 1234
# Megatron's T5 defaults: `--decoder-seq-length 128`, `--vocab-extra-ids 100`.
DEFAULT_DECODER_SEQ_LENGTH = 128
DEFAULT_VOCAB_EXTRA_IDS = 100


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
)}


def sample_kind(name: str) -> SampleKind:
    """The registered kind `name`.

    Raises:
        ValueError: no kind has that name.
    """
    if name not in SAMPLE_KINDS:
        raise ValueError(f"model must be one of {', '.join(SAMPLE_KINDS)}, got {name!r}")
    return SAMPLE_KINDS[name]


class SpecialIds(Protocol):
    """The special token ids a span-corruption sample is built from (`preprocess.tokenizers.t5.T5SpecialIds`)."""

    pad: int
    eos: int
    decoder_start: int
    sentinels: tuple[int, ...]


@dataclass(frozen=True)
class ViewTokens:
    """What a training view takes of the run's tokenizer."""

    decode: Callable[[list[int]], str]
    """Token ids -> text."""
    special_ids: Callable[[int], SpecialIds]
    """`vocab_extra_ids` -> the special ids; called only by the kinds that need them (it may refuse a
    tokenizer without that convention)."""


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

