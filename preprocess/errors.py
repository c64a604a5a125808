"""The errors the preprocess room raises on purpose; each message is one line naming what is wrong."""

from indexed_dataset.errors import TokenmillError


class InputError(TokenmillError):
    """Bad input data: a missing or empty file, a line that is not JSON, a missing key, bad UTF-8.

    The message starts with `file:line:` when a line is at fault.
    """


class TokenizerError(TokenmillError):
    """A tokenizer cannot be built (missing file, unknown type, missing option) or cannot encode a text."""


class EncodeError(TokenizerError):
    """A text could not be tokenized; `index` is the text's position in the batch that failed."""

    def __init__(self, index: int, reason: str) -> None:
        super().__init__(reason)
        self.index = index
        self.reason = reason
