"""The exception types every tokenmill room raises.

They live in the lowest room so that every other room can subclass them, and so a CLI can turn any of
our own failures into one clear line and an exit code while a bug still shows its traceback.
"""


class TokenmillError(Exception):
    """Base class of every error tokenmill raises on purpose (bad input, bad files, bad configs)."""


class IndexFormatError(TokenmillError):
    """A `.bin/.idx` pair is missing, truncated, damaged or inconsistent; the message names the file."""


class TokenRangeError(TokenmillError):
    """A token id does not fit the dataset's dtype; the message names the document."""


class ShardFormatError(TokenmillError):
    """An Arrow or MindRecord dataset is missing, damaged or not made of token rows; names the file."""
