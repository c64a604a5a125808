"""Synthetic SQuAD-format sets whose answers follow a learnable rule, for the QA fine-tuning tests.

Each context is filler words with one "<marker> X Y <end>" inside (English: "the answer is X Y ."; Chinese:
"答案是XY。"); the answer is what stands between the marker and the end mark, one to three words or
characters. A tiny BERT learns to find it from scratch in seconds.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

ENGLISH = {"marker": ["the", "answer", "is"], "end": ".", "joiner": " ", "question": "what is the answer ?"}
CHINESE = {"marker": list("答案是"), "end": "。", "joiner": "", "question": "答案是什么？"}


def filler_words(vocab_file: Path, language: dict, limit: int = 200) -> list[str]:
    """Whole pieces of a WordPiece vocabulary usable as filler: letters (or one CJK character), none of the
    rule's own words."""
    reserved = set(language["marker"]) | {language["end"], "what", "answer", "?"}
    words = []
    for piece in vocab_file.read_text(encoding="utf-8").split("\n"):
        cjk = len(piece) == 1 and "\u4e00" <= piece <= "\u9fff"
        if (cjk or (piece.isalpha() and piece.isascii() and len(piece) >= 3)) and piece.lower() not in reserved:
            words.append(piece)
    return words[:limit]


def write_synthetic_squad(path: Path, words: list[str], language: dict, num_questions: int, seed: int) -> Path:
    """A SQuAD-format file of ``num_questions`` one-question paragraphs following the rule."""
    rng = random.Random(seed)
    join = language["joiner"].join
    paragraphs = []
    for i in range(num_questions):
        answer = [rng.choice(words) for _ in range(rng.randint(1, 3))]
        before = [rng.choice(words) for _ in range(rng.randint(0, 8))]
        after = [rng.choice(words) for _ in range(rng.randint(0, 8))]
        prefix = join(before + language["marker"]) + language["joiner"]
        text = join(answer)
        context = prefix + join([text, language["end"]] + after) if language["joiner"] else \
            prefix + text + language["end"] + join(after)
        paragraphs.append({"context": context, "qas": [{"id": f"s{i}", "question": language["question"],
                                                        "answers": [{"text": text, "answer_start": len(prefix)}]}]})
    path.write_text(json.dumps({"version": "1.1", "data": [{"title": "synthetic", "paragraphs": paragraphs}]},
                               ensure_ascii=False), encoding="utf-8")
    return path
