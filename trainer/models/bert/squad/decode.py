"""n-best span decoding (``run_qa``'s ``postprocess_qa_predictions``): start/end logits of every window of an
example -> its best answers as text of the original context, with their character offsets and probabilities.

    answers = decode_answers(examples, features, start_logits, end_logits, n_best_size=20, max_answer_length=30)
    answers["q1"][0]   # {'text': 'Berlin', 'score': 0.9941, 'start': 34, 'end': 40}
"""

from __future__ import annotations

import math

import numpy as np

from trainer.models.bert.squad.examples import QAExample
from trainer.models.bert.squad.features import NO_OFFSET, QAFeature


def _feature_candidates(feature: QAFeature, start_logits: np.ndarray, end_logits: np.ndarray, n_best_size: int,
                        max_answer_length: int) -> list[tuple[float, int, int]]:
    """(score = start + end logit, start char, end char) of the valid spans among the top starts and ends."""
    starts = np.argsort(start_logits)[::-1][:n_best_size]
    ends = np.argsort(end_logits)[::-1][:n_best_size]
    candidates = []
    for s in starts:
        for e in ends:
            if feature.offsets[s] == NO_OFFSET or feature.offsets[e] == NO_OFFSET:
                continue  # the question, a special token or padding
            if e < s or e - s + 1 > max_answer_length:
                continue
            candidates.append((float(start_logits[s] + end_logits[e]), feature.offsets[s][0], feature.offsets[e][1]))
    return candidates


def decode_answers(examples: list[QAExample], features: list[QAFeature], start_logits: np.ndarray,
                   end_logits: np.ndarray, n_best_size: int = 20, max_answer_length: int = 30) -> dict[str, list[dict]]:
    """The n best answers of each example, best first.

    Args:
        examples: the examples the features were built from.
        features: `trainer.models.bert.squad.features.build_features` of them.
        start_logits, end_logits: float [num_features, seq].
        n_best_size: starts and ends considered per window, and answers kept per example.
        max_answer_length: the longest answer, in tokens.

    Returns:
        Example id -> [{'text', 'score' (softmax over the n best), 'start', 'end' (characters)}]; an
        example without a valid span gets one empty answer with score 0.
    """
    candidates: dict[int, list[tuple[float, int, int]]] = {}
    for i, feature in enumerate(features):
        candidates.setdefault(feature.example_index, []).extend(
            _feature_candidates(feature, start_logits[i], end_logits[i], n_best_size, max_answer_length))
    answers = {}
    for index, example in enumerate(examples):
        best = sorted(candidates.get(index, []), key=lambda c: -c[0])[:n_best_size]
        if not best:
            answers[example.id] = [{"text": "", "score": 0.0, "start": 0, "end": 0}]
            continue
        top = best[0][0]
        weights = [math.exp(score - top) for score, _, _ in best]
        total = sum(weights)
        answers[example.id] = [{"text": example.context[start:end], "score": weight / total, "start": start,
                                "end": end} for (_, start, end), weight in zip(best, weights)]
    return answers
