"""Chinese whole-word information in WordPiece ids (LiBai's `--do-chinese-wwm`).

BERT's WordPiece splits Chinese text into single characters, so nothing in the ids says which characters
form a word, and whole-word masking (our BERT/T5 samplers, `samplers/bert/masking.py`) would mask single
characters. LiBai's `_BertCNWWMTokenizer` (`get_new_segment`) puts the words back: jieba segments the
sentence, and every Chinese character that continues a jieba word of at most 3 characters is written as
its `##X` continuation piece, which whole-word masking already groups with the piece before it:

    长江是中国最长的河流。  jieba: 长江 / 是 / 中国 / 最长 / 的 / 河流 / 。
    -> 长 ##江 是 中 ##国 最 ##长 的 河 ##流 。

Words of 4+ characters (明清两代) keep plain characters, as in LiBai. A `##X` missing from the vocabulary
keeps the plain id of `X` (never [UNK]). jieba's dictionary ships inside the package: nothing is downloaded.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence

import numpy as np

from .base import Tokenizer

# LiBai's test for "a Chinese token": it holds a character of the basic CJK block (U+4E00..U+9FA5).
CHINESE_CHARACTER = re.compile("[\u4e00-\u9fa5]")
# Longest jieba word whose continuation characters are marked, as LiBai's get_new_segment.
MAX_WORD_CHARACTERS = 3
CONTINUATION = "##"

_segmenter = None


def _jieba_words(text: str) -> set[str]:
    """The words jieba's default (precise, HMM) mode cuts `text` into; the dictionary loads once per process."""
    global _segmenter
    if _segmenter is None:
        import jieba

        # jieba logs "Building prefix dict ..." at DEBUG on its own stderr handler: keep the output clean.
        jieba.setLogLevel(logging.WARNING)
        _segmenter = jieba.Tokenizer()
    return set(_segmenter.lcut(text))


def whole_word_pieces(pieces: Sequence[str]) -> list[bool]:
    """For each WordPiece token, whether it continues a Chinese word (LiBai's `get_new_segment`).

    Args:
        pieces: the WordPiece tokens of one text, in order (no [CLS]/[SEP]).

    Returns:
        one flag per piece: True where the piece should be written as `##piece`.
    """
    words = _jieba_words("".join(pieces))
    continues = [False] * len(pieces)
    i = 0
    while i < len(pieces):
        if not CHINESE_CHARACTER.search(pieces[i]):
            i += 1
            continue
        # The longest word starting here, as LiBai tries lengths 3, 2, 1 (1 always "matches").
        length = next((n for n in range(MAX_WORD_CHARACTERS, 1, -1)
                       if i + n <= len(pieces) and "".join(pieces[i:i + n]) in words), 1)
        for k in range(i + 1, i + length):
            continues[k] = True
        i += length
    return continues


class ChineseWholeWordTokenizer(Tokenizer):
    """A WordPiece tokenizer whose Chinese word continuations are written as `##X` ids (see the module).

    Wraps `wordpiece.WordPieceTokenizer`; vocabulary, specials, eod, decode and affixes are the wrapped one's.
    """

    def __init__(self, wordpiece: Tokenizer) -> None:
        self.wordpiece = wordpiece
        self.backend = wordpiece.backend
        self.vocab_size = wordpiece.vocab_size
        self._eod = wordpiece._eod
        self.pad = wordpiece.pad
        self.special_tokens = wordpiece.special_tokens
        self.affixes = wordpiece.affixes

    def encode_plain(self, text: str) -> list[int]:
        encoding = self.backend.encode(text, add_special_tokens=False)
        ids = list(encoding.ids)
        for index, continues in enumerate(whole_word_pieces(encoding.tokens)):
            if continues:
                # LiBai checks the vocabulary too: a missing ##X keeps X's own id.
                marked = self.backend.token_to_id(CONTINUATION + encoding.tokens[index])
                if marked is not None:
                    ids[index] = marked
        return ids

    def encode(self, text: str) -> list[int]:
        prefix, suffix = self.affixes
        return [*prefix, *self.encode_plain(text), *suffix]

    def decode(self, ids) -> str:
        return self.wordpiece.decode(np.asarray(ids))
