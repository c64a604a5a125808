"""The offline sentence splitter: Punkt-like boundaries without any download."""

from __future__ import annotations

import pytest

from preprocess.sentences import SentenceSplitter


@pytest.mark.parametrize(
    ("text", "sentences"),
    [
        ("Hello world. This is a test! Is it? Yes.", ["Hello world.", "This is a test!", "Is it?", "Yes."]),
        ("Mr. Smith met Dr. Jones at 5 p.m. Then they left.", ["Mr. Smith met Dr. Jones at 5 p.m. Then they left."]),
        ("He lives in the U.S. now. She does not.", ["He lives in the U.S. now.", "She does not."]),
        ("Version 3.14 is out. Upgrade now.", ["Version 3.14 is out.", "Upgrade now."]),
        ('He said "Stop." Then he left.', ['He said "Stop."', "Then he left."]),
        ("No split here. lowercase follows.", ["No split here. lowercase follows."]),
        ("日本語です。次の文です！最後？", ["日本語です。", "次の文です！", "最後？"]),
        ("   \n  ", []),
        ("Trailing space.   ", ["Trailing space."]),
        ("Wait... What happened?", ["Wait...", "What happened?"]),
    ],
)
def test_english_boundaries(text, sentences):
    assert SentenceSplitter("english").split(text) == sentences


def test_keep_newlines_keeps_the_whitespace_after_each_sentence():
    text = "First line.\n\nSecond one.\nThird."
    assert SentenceSplitter(keep_newlines=True).split(text) == ["First line.\n\n", "Second one.\n", "Third."]
    assert "".join(SentenceSplitter(keep_newlines=True).split(text)) == text


def test_language_abbreviations():
    assert SentenceSplitter("german").split("Das ist z. B. gut. Wir gehen bzw. fahren. Ende.") == [
        "Das ist z. B. gut.", "Wir gehen bzw. fahren.", "Ende."]


def test_unknown_language_is_rejected():
    with pytest.raises(ValueError, match="not one of"):
        SentenceSplitter("klingon")
