"""Megatron-LM's zero-shot detokenisers (``tasks/zeroshot_gpt/detokenizer.py``), rule for rule.

WikiText-103 and PTB ship whitespace-tokenised text (``word @-@ word``, ``don 't``); Megatron undoes that
before the GPT tokenizer sees it, and picks the rules from the data file's name (``wiki`` -> WikiText,
``ptb`` -> PTB, ``lambada`` -> unchanged). `detokenizer_for` does the same unless a name is given.

    detokenize_wikitext("a @-@ b , c") -> "a-b, c"
"""

from __future__ import annotations

import re
from collections.abc import Callable

from trainer.errors import TrainConfigError

# Name -> the substring of a file name that selects it when none is given (Megatron's ``get_detokenizer``).
AUTO = "auto"
NONE = "none"


def detokenize_ptb(text: str) -> str:
    """Penn Treebank's tokenisation undone (Megatron's ``ptb_detokenizer``)."""
    for old, new in ((" '", "'"), (" \n", "\n"), ("\n ", "\n"), (" n't", "n't"), (" N ", "1 "), ("$ 1", "$1"),
                     ("# 1", "#1")):
        text = text.replace(old, new)
    return text


# (pattern, replacement) of the bracket and quote rules: the spaces inside a pair are removed.
_WIKITEXT_PAIRS = (
    (re.compile(r"\(\s*([^\)]*?)\s*\)"), r"(\1)"),
    (re.compile(r"\[\s*([^\]]*?)\s*\]"), r"[\1]"),
    (re.compile(r"{\s*([^}]*?)\s*}"), r"{\1}"),
    (re.compile(r"\"\s*([^\"]*?)\s*\""), r'"\1"'),
    (re.compile(r"'\s*([^']*?)\s*'"), r"'\1'"),
)


def detokenize_wikitext(text: str) -> str:
    """WikiText's tokenisation undone (Megatron's ``wikitext_detokenizer``, in its order)."""
    text = text.replace("s '", "s'")
    # Megatron's pattern (slashes included) is kept as it is, so the text matches its token counts.
    text = re.sub(r"/' [0-9]/", r"/'[0-9]/", text)
    for old, new in ((" @-@ ", "-"), (" @,@ ", ","), (" @.@ ", "."), (" : ", ": "), (" ; ", "; "), (" . ", ". "),
                     (" ! ", "! "), (" ? ", "? "), (" , ", ", ")):
        text = text.replace(old, new)
    for pattern, replacement in _WIKITEXT_PAIRS:
        text = pattern.sub(replacement, text)
    for old, new in (("= = = =", "===="), ("= = =", "==="), ("= =", "=="), (" \N{DEGREE SIGN} ", "\N{DEGREE SIGN}"),
                     (" \n", "\n"), ("\n ", "\n"), (" N ", " 1 "), (" 's", "'s")):
        text = text.replace(old, new)
    return text


def _unchanged(text: str) -> str:
    return text


DETOKENIZERS: dict[str, Callable[[str], str]] = {"ptb": detokenize_ptb, "wikitext": detokenize_wikitext,
                                                   "lambada": _unchanged, NONE: _unchanged}
# File-name substrings in Megatron's order of precedence -> detokeniser name.
_BY_FILE_NAME = (("ptb", "ptb"), ("wiki", "wikitext"), ("lambada", "lambada"))


def detokenizer_for(path: str, name: str = AUTO) -> Callable[[str], str]:
    """The detokeniser called ``name``, or with ``auto`` the one Megatron picks for ``path`` (none when
    the path names no known data set).

    Raises:
        TrainConfigError: an unknown name.
    """
    if name == AUTO:
        return next((DETOKENIZERS[chosen] for key, chosen in _BY_FILE_NAME if key in path), _unchanged)
    if name not in DETOKENIZERS:
        raise TrainConfigError(f"unknown detokenizer {name!r}; known: {AUTO}, {', '.join(DETOKENIZERS)}")
    return DETOKENIZERS[name]
