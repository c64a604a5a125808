"""The errors the samplers room raises on purpose; all are `TokenmillError`s, so CLIs print one line."""

from typing import Optional

from indexed_dataset import TokenmillError


class SamplerError(TokenmillError):
    """Base of every samplers error."""


class SplitFormatError(SamplerError, ValueError):
    """A split string ("949,50,1") cannot be parsed; also a ValueError because it is bad config."""


class BlendFormatError(SamplerError, ValueError):
    """A blend ("0.3 a 0.7 b") or its weights are malformed; also a ValueError because it is bad config."""


class EmptySplitError(SamplerError):
    """A split with no sequences or no tokens was asked for samples.

    Attributes:
        split: "train", "valid" or "test" when known, so a caller can name the flags behind the count.
    """

    def __init__(self, message: str, split: Optional[str] = None) -> None:
        super().__init__(message)
        self.split = split


class BlendSizeError(SamplerError):
    """A blend asks a member dataset for more samples than the member holds."""


class IndexMemoryError(SamplerError):
    """Index arrays asked for (a sample count) would not fit in this machine's available memory; the
    message gives the estimate in GiB."""
