"""Error messages in a CLI's own terms: config field names become the flags that set them."""

from __future__ import annotations

import argparse
import re

# snake_case words with at least one underscore; one-word fields are ordinary English words in messages.
_FIELD = re.compile(r"\b[a-z][a-z0-9]*(?:_[a-z0-9]+)+\b")


def flags_in_message(message: str, parser: argparse.ArgumentParser) -> str:
    """Rewrite every field name of ``message`` that is the destination of one of ``parser``'s flags."""
    flags = {action.dest: action.option_strings[0] for action in parser._actions if action.option_strings}
    return _FIELD.sub(lambda m: flags.get(m.group(0), m.group(0)), message)
