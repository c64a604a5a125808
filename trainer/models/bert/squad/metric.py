"""The official SQuAD v1.1 evaluation (``evaluate-v1.1.py``), as a library.

    squad_metric({"q1": "the Berlin"}, {"q1": ["Berlin", "in Berlin"]})   # {'exact_match': 100.0, 'f1': 100.0}

Answers are normalised as the official script does: lower case, punctuation removed, the articles a/an/the
removed, whitespace collapsed. Exact match and F1 (over whitespace tokens of the normalised answers) are the
maximum over the gold answers, averaged over the questions, in percent. A question without a prediction
scores 0.
"""

from __future__ import annotations

import re
import string
from collections import Counter

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = frozenset(string.punctuation)
PERCENT = 100.0


def normalize_answer(text: str) -> str:
    """Lower case, no punctuation, no articles, single spaces (the official order of the steps)."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match_score(prediction: str, gold: str) -> bool:
    return normalize_answer(prediction) == normalize_answer(gold)


def f1_score(prediction: str, gold: str) -> float:
    """Token F1 of the normalised answers (0 when they share no token)."""
    predicted, expected = normalize_answer(prediction).split(), normalize_answer(gold).split()
    common = sum((Counter(predicted) & Counter(expected)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(predicted), common / len(expected)
    return 2 * precision * recall / (precision + recall)


def squad_metric(predictions: dict[str, str], gold_answers: dict[str, list[str]]) -> dict[str, float]:
    """``{'exact_match': ..., 'f1': ...}`` in percent over the questions of ``gold_answers``.

    Args:
        predictions: question id -> predicted text (a missing id scores 0, as the official script).
        gold_answers: question id -> its gold answer texts.
    """
    if not gold_answers:
        return {"exact_match": 0.0, "f1": 0.0}
    exact = f1 = 0.0
    for qid, golds in gold_answers.items():
        if qid not in predictions or not golds:
            continue
        exact += max(exact_match_score(predictions[qid], gold) for gold in golds)
        f1 += max(f1_score(predictions[qid], gold) for gold in golds)
    return {"exact_match": PERCENT * exact / len(gold_answers), "f1": PERCENT * f1 / len(gold_answers)}
