"""Error messages in a CLI's own terms: config field names become the flags that set them."""

from __future__ import annotations

import argparse
import re

# snake_case words with at least one underscore; one-word fields are ordinary English words in messages
# unless quoted as `dataset`. A key of a file (``model_config.json: shape.num_layers=0``: after a dot or
# before an equals sign) is the file's, not a flag the user typed.
_FIELD = re.compile(r"(?<![.\w])[a-z][a-z0-9]*(?:_[a-z0-9]+)+\b(?!=)")
_QUOTED_FIELD = re.compile(r"`([a-z][a-z0-9_]*)`")


def flags_in_message(message: str, parser: argparse.ArgumentParser) -> str:
    """Rewrite every field name of ``message`` that is the destination of one of ``parser``'s flags
    (snake_case names, and any name quoted in backticks: "`dataset`" -> "--dataset")."""
    flags = {action.dest: action.option_strings[0] for action in parser._actions if action.option_strings}
    message = _QUOTED_FIELD.sub(lambda m: flags.get(m.group(1), m.group(0)), message)
    return _FIELD.sub(lambda m: flags.get(m.group(0), m.group(0)), message)
