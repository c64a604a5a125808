"""Checks on tokenizer files, so that a missing file is one clear line and never a download attempt."""

from __future__ import annotations

import os

from ..errors import TokenizerError


def require_file(path: str, what: str) -> str:
    """`path` if it is an existing file.

    Raises:
        TokenizerError: it is not.
    """
    if not os.path.isfile(path):
        raise TokenizerError(f"{path}: {what} not found")
    return path
