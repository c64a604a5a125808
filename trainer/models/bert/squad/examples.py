"""SQuAD-format files (SQuAD v1.1, CMRC 2018): JSON in, `QAExample`s out, one clear error for a malformed file.

    examples = read_squad_file("dev-v1.1.json")       # {"data": [{"paragraphs": [{"context", "qas": [...]}]}]}
    examples = parse_predict_inputs(["Berlin is the capital of Germany. - What is the capital of Germany?"])
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from indexed_dataset.errors import TokenmillError
from indexed_dataset.structured_files import DATA_FILE_LIMIT_BYTES, read_json_file

# MindFormers' "context - question" convention: the last " - " separates them.
CONTEXT_QUESTION_SEPARATOR = " - "
# The keys only SQuAD v2.0 has: its unanswerable questions would train as answerable ones under v1.1's rules.
SQUAD_V2_KEYS = ("is_impossible", "plausible_answers")
SQUAD_V2_VERSION_PREFIX = "v2"


class SquadFormatError(TokenmillError, ValueError):
    """A SQuAD file or prediction input that does not have the expected shape."""


@dataclass(frozen=True, slots=True)
class QAExample:
    """One question over one context; answers as (text, character offset in the context)."""

    id: str
    question: str
    context: str
    answers: tuple[tuple[str, int], ...] = ()


def _require(condition: bool, where: str, what: str) -> None:
    if not condition:
        raise SquadFormatError(f"{where}: {what}")


def _answers(qa: dict, context: str, where: str) -> tuple[tuple[str, int], ...]:
    answers = qa.get("answers", [])
    _require(isinstance(answers, list), where, "answers must be a list")
    out = []
    for j, answer in enumerate(answers):
        at = f"{where}.answers[{j}]"
        _require(isinstance(answer, dict) and isinstance(answer.get("text"), str)
                 and isinstance(answer.get("answer_start"), int), at, "needs text (string) and answer_start (integer)")
        start, text = answer["answer_start"], answer["text"]
        _require(text.strip() != "", at, "the answer text is empty")
        _require(context[start:start + len(text)] == text, at,
                 f"answer_start {start} does not point at {text!r} in the context")
        out.append((text, start))
    return tuple(out)


def read_squad_file(path: str | os.PathLike, training: bool = False) -> list[QAExample]:
    """Every question of a SQuAD v1.1-format file, in file order.

    Args:
        training: the file trains a model: it must hold a question, and every question an answer.

    Raises:
        SquadFormatError: not JSON, not SQuAD's shape, SQuAD v2.0 (``is_impossible``, ``plausible_answers``,
            version v2...), an empty question, context or answer, a duplicate id, or (``training``) no question
            or a question without an answer; the message names the file and the JSON path.
        OSError: the file cannot be read.
    """
    value = read_json_file(path, DATA_FILE_LIMIT_BYTES, error=SquadFormatError)
    _require(isinstance(value, dict) and isinstance(value.get("data"), list), str(path),
             'expected a SQuAD object {"data": [articles]}')
    version = str(value.get("version", ""))
    _require(not version.startswith(SQUAD_V2_VERSION_PREFIX), f"{path}: version",
             f"{version!r} is SQuAD v2.0, whose unanswerable questions tokenmill does not train or score (v1.1 only)")
    examples = []
    seen: dict[str, str] = {}  # id -> where it was first
    for a, article in enumerate(value["data"]):
        paragraphs = article.get("paragraphs") if isinstance(article, dict) else None
        _require(isinstance(paragraphs, list), f"{path}: data[{a}]", "needs a paragraphs list")
        for p, paragraph in enumerate(paragraphs):
            where = f"{path}: data[{a}].paragraphs[{p}]"
            _require(isinstance(paragraph, dict) and isinstance(paragraph.get("context"), str)
                     and isinstance(paragraph.get("qas"), list), where, "needs context (string) and qas (list)")
            for q, qa in enumerate(paragraph["qas"]):
                at = f"{where}.qas[{q}]"
                _require(isinstance(qa, dict) and isinstance(qa.get("question"), str) and "id" in qa, at,
                         "needs id and question (string)")
                v2_keys = [key for key in SQUAD_V2_KEYS if key in qa]
                _require(not v2_keys, at, f"{v2_keys[0] if v2_keys else ''} is SQuAD v2.0, whose unanswerable "
                         "questions tokenmill does not train or score (v1.1 only)")
                _require(paragraph["context"].strip() != "", where, "the context is empty")
                _require(qa["question"].strip() != "", at, "the question is empty")
                qid = str(qa["id"])
                _require(qid not in seen, at, f"id {qid!r} is also the id of {seen.get(qid)} (ids must be unique)")
                seen[qid] = at.split(": ", 1)[-1]
                answers = _answers(qa, paragraph["context"], at)
                _require(answers or not training, at, "a training question needs an answer")
                examples.append(QAExample(qid, qa["question"], paragraph["context"], answers))
    _require(examples or not training, str(path), "no training examples (no question in any paragraph)")
    return examples


def parse_predict_inputs(texts: list[str]) -> list[QAExample]:
    """MindFormers' "context - question" strings (split at the last " - ") as examples with ids "0", "1", ...

    Raises:
        SquadFormatError: a string without the separator.
    """
    examples = []
    for i, text in enumerate(texts):
        context, separator, question = text.rpartition(CONTEXT_QUESTION_SEPARATOR)
        _require(bool(separator) and context.strip() != "" and question.strip() != "", f"input {i}",
                 f"expected 'context{CONTEXT_QUESTION_SEPARATOR}question', got {text[:60]!r}")
        examples.append(QAExample(str(i), question.strip(), context.strip()))
    return examples


def read_predict_file(path: str | os.PathLike) -> list[QAExample]:
    """A JSON list of {"context": ..., "question": ...} (optional "id") as examples.

    Raises:
        SquadFormatError: not such a list (naming the file and the entry).
    """
    value = read_json_file(path, DATA_FILE_LIMIT_BYTES, error=SquadFormatError)
    _require(isinstance(value, list), str(path), 'expected a JSON list of {"context": ..., "question": ...}')
    examples = []
    for i, item in enumerate(value):
        _require(isinstance(item, dict) and isinstance(item.get("context"), str)
                 and isinstance(item.get("question"), str), f"{path}: [{i}]", "needs context and question strings")
        examples.append(QAExample(str(item.get("id", i)), item["question"], item["context"]))
    return examples
