"""The official SQuAD v1.1 metric (evaluate-v1.1.py), on cases worked out by hand."""

from __future__ import annotations

import pytest

from trainer.models.bert.squad.metric import f1_score, normalize_answer, squad_metric


def test_normalisation_lowercases_strips_punctuation_and_articles_and_collapses_spaces():
    assert normalize_answer("The  Eiffel-Tower, in PARIS!") == "eiffeltower in paris"
    assert normalize_answer("an apple a day") == "apple day"
    assert normalize_answer("theory") == "theory"  # "the" only as a whole word
    assert normalize_answer("  ") == ""


def test_f1_counts_shared_tokens_with_repeats():
    # prediction "in the stroma" -> [in, stroma]; gold "the stroma" -> [stroma]: P 1/2, R 1, F1 2/3
    assert f1_score("in the stroma", "the stroma") == pytest.approx(2 / 3)
    # [a, b, b] vs [b, b, c]: two shared b's: P 2/3, R 2/3
    assert f1_score("x y y", "y y z") == pytest.approx(2 / 3)
    assert f1_score("Berlin", "Paris") == 0.0
    assert f1_score("", "Paris") == 0.0


def test_exact_match_and_f1_take_the_best_gold_answer_and_average_in_percent():
    predictions = {"q1": "the Berlin.", "q2": "in the stroma", "q3": ""}
    gold = {"q1": ["Berlin", "in Berlin"], "q2": ["the stroma", "in the chloroplasts"], "q3": ["1991"],
            "q4": ["Guido van Rossum"]}  # q4 unanswered: 0, as the official script scores it
    metrics = squad_metric(predictions, gold)
    assert metrics["exact_match"] == pytest.approx(100 * 1 / 4)
    assert metrics["f1"] == pytest.approx(100 * (1 + 2 / 3) / 4)
    assert squad_metric({"q": "Berlin"}, {"q": ["berlin"]}) == {"exact_match": 100.0, "f1": 100.0}
