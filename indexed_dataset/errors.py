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


# What a command reports as one line (`prog: error: message`, a non-zero exit) instead of a traceback:
# our own errors, and the operating system's (a full disk, a path that cannot be written or read),
# whose message names the path.
REPORTED_ERRORS = (TokenmillError, OSError)
