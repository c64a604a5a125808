"""Offline rule-based sentence splitting for `--split-sentences` (no NLTK, nothing to download).

Megatron uses NLTK's Punkt, whose models must be downloaded at run time. We split with rules instead:
a sentence ends at `.`, `!`, `?` or `…` (plus closing quotes/brackets) followed by whitespace and an
upper-case letter, digit or opening quote, unless the word before a period is a known abbreviation of
the language or a single letter (an initial, "U.S."); CJK full stops (`。！？`) end a sentence with
no space needed. Sentences are stripped of surrounding whitespace; with `keep_newlines` the
whitespace (newlines included) after a sentence stays attached to it, like Megatron's Punkt variant.
Boundaries can differ from Punkt's in rare cases (Punkt also learns abbreviations from statistics).
"""

from __future__ import annotations

import re

_COMMON = {"e", "i", "vs", "etc", "no", "nr", "fig", "figs", "vol", "vols", "pp", "cf", "ca", "approx"}
ABBREVIATIONS: dict[str, frozenset[str]] = {
    "english": frozenset(_COMMON | {
        "mr", "mrs", "ms", "dr", "prof", "sr", "jr", "st", "mt", "inc", "ltd", "co", "corp", "dept", "est",
        "gen", "gov", "sen", "rep", "rev", "capt", "col", "lt", "sgt", "jan", "feb", "mar", "apr", "jun",
        "jul", "aug", "sep", "sept", "oct", "nov", "dec", "eq", "al", "ed", "eds", "ave", "blvd", "min",
        "max", "ch", "sec", "viz"}),
    "german": frozenset(_COMMON | {
        "bzw", "usw", "vgl", "evtl", "ggf", "inkl", "str", "hr", "fr", "dr", "prof", "bspw", "ca", "zb",
        "jh", "jhd", "abs", "art", "bd", "geb", "gest", "dt", "allg", "sog", "u"}),
    "french": frozenset(_COMMON | {
        "m", "mm", "mme", "mlle", "dr", "pr", "me", "st", "ste", "av", "bd", "env", "ex", "cf", "p", "chap"}),
    "spanish": frozenset(_COMMON | {
        "sr", "sra", "srta", "dr", "dra", "ud", "uds", "pág", "págs", "av", "avda", "aprox", "etc", "núm"}),
    "italian": frozenset(_COMMON | {"sig", "sigg", "dott", "prof", "ing", "avv", "pag", "ecc", "es"}),
    "portuguese": frozenset(_COMMON | {"sr", "sra", "dr", "dra", "prof", "pág", "av", "ex", "etc"}),
    "dutch": frozenset(_COMMON | {"dhr", "mevr", "dr", "prof", "bijv", "blz", "nl", "o.a", "enz", "ca"}),
}
SUPPORTED_LANGUAGES = tuple(ABBREVIATIONS)

# End punctuation + closing marks, when followed by whitespace and a plausible sentence start; or a
# CJK terminator, which needs no space.
_BOUNDARY = re.compile(
    r"[.!?…]+[\"'”’»)\]]*(?=\s+[\"'“‘«(\[¿¡]?[0-9A-ZÀ-ÖØ-ÞĀ-ſА-Я])"
    r"|[。！？]+[」』”’）)]*"
)
_WORD_BEFORE = re.compile(r"(\w+)$")
# Longest abbreviation we look back for (characters).
_LOOKBEHIND = 12


class SentenceSplitter:
    """Splits texts into sentences.

    Args:
        lang: one of SUPPORTED_LANGUAGES (NLTK's names).
        keep_newlines: keep the whitespace after each sentence inside it.

    Raises:
        ValueError: an unsupported language.
    """

    def __init__(self, lang: str = "english", keep_newlines: bool = False) -> None:
        if lang not in ABBREVIATIONS:
            raise ValueError(f"lang {lang!r} is not one of {', '.join(SUPPORTED_LANGUAGES)}")
        self.abbreviations = ABBREVIATIONS[lang]
        self.keep_newlines = keep_newlines

    def _is_abbreviation(self, text: str, period: int) -> bool:
        word = _WORD_BEFORE.search(text, max(0, period - _LOOKBEHIND), period)
        if word is None:
            return False
        token = word.group(1)
        return len(token) == 1 or token.lower() in self.abbreviations

    def split(self, text: str) -> list[str]:
        """The sentences of `text`, in order (empty ones dropped)."""
        sentences = []
        start = len(text) - len(text.lstrip())
        for match in _BOUNDARY.finditer(text, start):
            single_period = text[match.start()] == "." and match.end() - match.start() == 1
            if single_period and self._is_abbreviation(text, match.start()):
                continue
            end = match.end()
            following = end
            while following < len(text) and text[following].isspace():
                following += 1
            sentences.append(text[start:following] if self.keep_newlines else text[start:end].strip())
            start = following
        last = text[start:] if self.keep_newlines else text[start:].strip()
        sentences.append(last)
        return [sentence for sentence in sentences if sentence.strip()]
