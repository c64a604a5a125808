"""`GPTDatasetConfig`: everything `build_gpt_datasets` needs, with Megatron's field names and defaults.

    cfg = GPTDatasetConfig(sequence_length=2048, random_seed=1234,
                           blend=(["data/a_text_document", "data/b_text_document"], [0.7, 0.3]),
                           split="949,50,1", eod_id=50256)
    mock = GPTDatasetConfig(sequence_length=2048, mock=True, vocab_size=50257, eod_id=50256)   # --mock-data
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from .errors import BlendFormatError
from .mock import MOCK_SPLIT
from .indices import MID_LEVEL_DATASET_SURPLUS, SEPARATE_FINAL_EPOCH_THRESHOLD
from .splits import SPLIT_NAMES, normalize_weights, parse_split

Blend = tuple[list[str], Optional[list[float]]]
"""Dataset prefixes and their weights (None: no weights, see `build_gpt_datasets`)."""

PAD_TOKEN_ID = -1
"""Megatron's pad id when the tokenizer has none; never a real token, so padding is recognisable."""


def _check_blend(blend: Blend, field: str) -> None:
    """Raise BlendFormatError unless `blend` is (non-empty prefixes, None or one valid weight each)."""
    prefixes, weights = blend
    if not prefixes:
        raise BlendFormatError(f"{field}: no dataset prefixes")
    if weights is not None:
        if len(weights) != len(prefixes):
            raise BlendFormatError(f"{field}: {len(prefixes)} prefixes but {len(weights)} weights")
        normalize_weights(weights)


@dataclass(kw_only=True, slots=True)
class GPTDatasetConfig:
    """How to turn `.bin/.idx` datasets into GPT training samples."""

    sequence_length: int
    """Tokens per sample L (the model's context length)."""
    random_seed: int = 1234
    """Seed of the numpy RandomState that shuffles the document and sample indices."""
    blend: Optional[Blend] = None
    """(prefixes, weights or None) divided into splits by `split`; exclusive with `blend_per_split`."""
    blend_per_split: Optional[list[Optional[Blend]]] = None
    """One blend (or None) per split (train, valid, test), each used whole; needs `split` None."""
    split: Optional[str] = None
    """Split fractions such as "949,50,1" (normalised); required with `blend`."""
    path_to_cache: Optional[str] = None
    """Directory of cached index arrays; None: `index-cache/` beside each dataset's files."""
    add_extra_token: bool = True
    """Read L + 1 tokens per sample so labels are the inputs shifted by one (Megatron's default)."""
    drop_last_partial_validation_sequence: bool = True
    """Drop the last, shorter validation sample; False keeps it, padded (train/test always drop)."""
    reset_position_ids: bool = False
    """Restart position ids after every EOD token."""
    reset_attention_mask: bool = False
    """Return an `attention_mask` ([1, L, L] bool, True = masked) that also blocks attention across EOD."""
    eod_mask_loss: bool = False
    """Zero the loss mask at positions whose input token is EOD."""
    eod_id: Optional[int] = None
    """End-of-document token id; required by the three options above."""
    pad_id: int = PAD_TOKEN_ID
    """Id padding a partial sample (tokenizer pad, else -1); labels equal to it get loss mask 0."""
    mid_level_dataset_surplus: float = MID_LEVEL_DATASET_SURPLUS
    """Extra fraction of samples each weighted blend member is built with."""
    separate_final_epoch_threshold: float = SEPARATE_FINAL_EPOCH_THRESHOLD
    """The last epoch is shuffled apart when it supplies fewer than this fraction of an epoch."""
    mmap_bin_files: bool = True
    """Megatron's: map each mmap dataset's `.bin`; False: read its tokens with plain file reads (the same tokens)."""
    mock: bool = False
    """Megatron's mock data (`mock.MockTokenSource`) instead of a blend: needs `vocab_size` and `eod_id`, no
    blend; `split` is Megatron's "1,1,1" (None is filled in)."""
    vocab_size: Optional[int] = None
    """The tokenizer's vocabulary size; with `mock` only (the mock tokens count modulo it)."""

    def __post_init__(self) -> None:
        if self.sequence_length < 1:
            raise ValueError(f"sequence_length must be >= 1, got {self.sequence_length}")
        if self.mock or self.vocab_size is not None:
            self._check_mock()
        elif (self.blend is None) == (self.blend_per_split is None):
            raise ValueError("exactly one of blend and blend_per_split must be given")
        elif self.blend is not None:
            if self.split is None:
                raise ValueError("split is required with blend (e.g. '949,50,1')")
            parse_split(self.split)
            _check_blend(self.blend, "blend")
        else:
            if self.split is not None:
                raise ValueError(f"split must be None with blend_per_split, got {self.split!r}")
            if len(self.blend_per_split) != len(SPLIT_NAMES):
                raise ValueError(f"blend_per_split needs {len(SPLIT_NAMES)} entries, got {len(self.blend_per_split)}")
            for name, blend in zip(SPLIT_NAMES, self.blend_per_split):
                if blend is not None:
                    _check_blend(blend, f"blend_per_split[{name}]")
        if (self.reset_position_ids or self.reset_attention_mask or self.eod_mask_loss) and self.eod_id is None:
            raise ValueError("eod_id is required with reset_position_ids, reset_attention_mask or eod_mask_loss")
        if self.mid_level_dataset_surplus < 0:
            raise ValueError(f"mid_level_dataset_surplus must be >= 0, got {self.mid_level_dataset_surplus}")
        if not 0 <= self.separate_final_epoch_threshold <= 1:
            raise ValueError(f"separate_final_epoch_threshold must be in [0, 1], got {self.separate_final_epoch_threshold}")

    def _check_mock(self) -> None:
        """The rules of `mock`, and Megatron's split filled in."""
        if not self.mock:
            raise ValueError("vocab_size applies to mock data only")
        if self.blend is not None or self.blend_per_split is not None:
            raise ValueError("mock data excludes blend and blend_per_split")
        if self.split not in (None, MOCK_SPLIT):
            raise ValueError(f"mock data is split {MOCK_SPLIT} (Megatron's), got split {self.split!r}")
        if self.vocab_size is None or self.eod_id is None:
            raise ValueError("mock data needs vocab_size and eod_id (the tokenizer's)")
        if self.vocab_size < 1:
            raise ValueError(f"vocab_size must be >= 1, got {self.vocab_size}")
        self.split = MOCK_SPLIT

    @property
    def extra_tokens(self) -> int:
        """1 if samples read one token beyond L, else 0."""
        return int(self.add_extra_token)
