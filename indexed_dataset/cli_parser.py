"""The argument parser every tokenmill command uses: exact flag names, one-line errors, honest help.

    parser = CommandParser(prog="merge-datasets", description="...")
    parser.add_argument("--output-prefix", required=True, help="stem of the merged dataset")

It differs from `argparse.ArgumentParser` in three ways:

- **No prefix matching** (``allow_abbrev=False``): ``--loss-scale 1024`` must never be read as
  ``--loss-scale-window 1024`` because the first is unknown; a flag is its full name or an alias.
- **One-line errors**: a bad flag prints ``prog: error: message`` and exits 2, without the usage block;
  an unknown flag names the nearest known one (``did you mean --vocab-size?``).
- **Defaults in the help** of every option that has one, except switches (their default is "off") and
  options whose text already states its default.

It also holds the value types every command's numeric flags use: `finite_float` (``inf`` and ``nan`` are
never a flag's number), `int_at_least` and `seed_value`.

It lives in the lowest room because every room's commands use it.
"""

from __future__ import annotations

import argparse
import difflib
import math
import re
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NoReturn

EXIT_USAGE = 2
# difflib's similarity cutoff for suggesting a flag: 0.6 is its default; "--vocab-sizes" vs
# "--vocab-size" scores 0.96, "--lr-warmup" vs "--lr-warmup-iters" 0.81, unrelated names stay below.
SUGGESTION_CUTOFF = 0.6
# A help text that states its default itself ("default 4 x hidden_size", "(default: $RANK, else 0)");
# "Megatron's default)" names no value, so the value is still appended.
STATES_DEFAULT = re.compile(r"\bdefault\b[ :]", re.IGNORECASE)
# numpy's and torch's seeds are unsigned 32-bit (np.random.seed refuses 2**32 and negatives).
SEED_MAX = 2**32 - 1


def finite_float(text: str) -> float:
    """argparse type of every float flag: a finite number (Python's float() also reads "inf" and "nan",
    which no learning rate, dropout or temperature can be)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def int_at_least(minimum: int) -> Callable[[str], int]:
    """argparse type: an integer >= ``minimum`` (a count that a smaller value would silently empty)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value

    parse.__name__ = f"int_at_least_{minimum}"
    return parse


def seed_value(text: str) -> int:
    """argparse type of every ``--seed``: an integer in [0, `SEED_MAX`]."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if not 0 <= value <= SEED_MAX:
        raise argparse.ArgumentTypeError(f"must be in [0, {SEED_MAX}], got {value}")
    return value


def nearest_option(word: str, options: Iterable[str]) -> str | None:
    """The known option most similar to ``word`` (``--vocab-sizes=3`` -> ``--vocab-size``), or None."""
    name = word.split("=", 1)[0]
    options = sorted(set(options))
    extending = [option for option in options if option.startswith(name)]
    if len(extending) == 1:  # an abbreviation, which argparse would have accepted before
        return extending[0]
    matches = difflib.get_close_matches(name, options, n=1, cutoff=SUGGESTION_CUTOFF)
    return matches[0] if matches else None


def unrecognized_message(extras: Sequence[str], options: Iterable[str]) -> str:
    """``unrecognized argument: --vocab-sizes 5 (did you mean --vocab-size?)``."""
    options = list(options)
    noun = "argument" if len(extras) == 1 else "arguments"
    message = f"unrecognized {noun}: {' '.join(extras)}"
    for word in extras:
        if word.startswith("-"):
            suggestion = nearest_option(word, options)
            if suggestion is not None:
                return f"{message} (did you mean {suggestion}?)"
    return message


def _shown_default(action: argparse.Action) -> str | None:
    """The default to append to ``action``'s help, or None when it adds nothing."""
    default = action.default
    if (action.nargs == 0 or default is None or default is argparse.SUPPRESS or isinstance(default, bool)
            or default in ([], ())):
        return None
    if STATES_DEFAULT.search(action.help or ""):
        return None
    if isinstance(default, (list, tuple)):
        return " ".join(map(str, default))
    return str(default)


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions as written (they hold example command lines); ``(default: X)`` after options that
    have a default worth showing (see `_shown_default`)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = _shown_default(action)
        if default is None:
            return text
        # argparse %-formats help strings: escape a literal % in the value.
        return f"{text} (default: {default.replace('%', '%%')})"


class CommandParser(argparse.ArgumentParser):
    """An `argparse.ArgumentParser` without prefix matching, with one-line errors (see the module)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def option_strings(self) -> list[str]:
        """Every flag spelling this parser knows (aliases included)."""
        return [option for action in self._actions for option in action.option_strings]

    def parse_args(self, args: Sequence[str] | None = None,
                   namespace: argparse.Namespace | None = None) -> argparse.Namespace:
        self._words = list(sys.argv[1:] if args is None else args)
        namespace, extras = self.parse_known_args(args, namespace)
        if extras:
            self.error(unrecognized_message(extras, self.option_strings()))
        return namespace

    def full_message(self, message: str) -> str:
        """argparse's ``message``, naming a misspelt flag that another error (a required flag missing)
        would hide."""
        if message.startswith("unrecognized"):
            return message
        known = set(self.option_strings())
        unknown = [word for word in getattr(self, "_words", ())
                   if word.startswith("--") and word.split("=", 1)[0] not in known]
        return f"{message}; {unrecognized_message(unknown, known)}" if unknown else message

    def error(self, message: str) -> NoReturn:
        """``prog: error: message`` on stderr and exit 2 (argparse would print the whole usage first)."""
        self.exit(EXIT_USAGE, f"{self.prog}: error: {self.full_message(message)}\n")
