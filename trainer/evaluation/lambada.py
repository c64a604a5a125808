"""LAMBADA cloze accuracy with Megatron-LM's protocol (``tasks/zeroshot_gpt``).

Each passage's last word is predicted from the rest in one teacher-forced pass: a passage counts as
correct when every token of the target is the model's argmax at its position. With ``strict`` (Megatron's
``--strict-lambada``) the target is the last whitespace-separated word, tokenised as ``" " + word``
after the context ``text[:where the word starts].strip()``; otherwise it is the passage's last token.

Input: JSON lines ``{"text": "..."}`` (Megatron's and OpenAI's LAMBADA release).

    with open_eval_model(EvalModelConfig(load="gpt2/")) as model:
        result = evaluate_lambada(model, read_lambada("lambada_test.jsonl"), strict=True)
    result.accuracy, result.count
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from indexed_dataset.structured_files import DATA_FILE_LIMIT_BYTES, parse_json, read_bounded_text
from preprocess.tokenizers import Tokenizer
from trainer.evaluation.scoring import EvalDataError, EvalModel, ScoreRow, score_rows

# A passage is its context and its last word, the target.
MIN_PASSAGE_WORDS = 2


@dataclass(frozen=True, slots=True)
class ClozeExample:
    """A passage split into context and target token ids."""

    context: list[int]
    target: list[int]


@dataclass(slots=True)
class LambadaResult:
    """Accuracy over the passages, and each passage's outcome."""

    accuracy: float
    correct: int
    count: int
    hits: list[bool] = field(default_factory=list)
    """Per passage: every target token was the greedy choice."""
    log_probs: list[float] = field(default_factory=list)
    """Per passage: the target's log-probability (natural log)."""


def read_lambada(path: str | Path) -> list[str]:
    """The ``text`` of each non-empty line of a JSON-lines file.

    Raises:
        EvalDataError: unreadable file, a line that is not a JSON object with a non-empty ``text`` string,
            a passage of one word (no context), or no passage at all (naming the file and line).
    """
    try:
        lines = read_bounded_text(path, DATA_FILE_LIMIT_BYTES, error=EvalDataError).splitlines()
    except OSError as error:
        raise EvalDataError(f"{path}: cannot read ({error.strerror})") from None
    texts = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        record = parse_json(line, f"{path} line {number}", error=EvalDataError)
        text = record.get("text") if isinstance(record, dict) else None
        if not isinstance(text, str) or not text.strip():
            raise EvalDataError(f'{path} line {number}: expected an object with a non-empty "text" string')
        if len(text.split()) < MIN_PASSAGE_WORDS:
            # Its last word is all there is: nothing to predict it from (non-strict scoring would predict the
            # word's last token from its first ones).
            raise EvalDataError(f"{path} passage {len(texts) + 1}: no context tokens to predict from (line "
                                f"{number} is one word)")
        texts.append(text)
    if not texts:
        raise EvalDataError(f"{path}: no passage")
    return texts


def cloze_example(text: str, tokenizer: Tokenizer, strict: bool) -> ClozeExample:
    """Megatron's split of a passage into context and target (``_LambadaDataset.get_tokens``)."""
    if not strict:
        ids = tokenizer.encode(text)
        return ClozeExample(ids[:-1], ids[-1:])
    last_word = text.split()[-1]
    start = text.rfind(last_word)
    return ClozeExample(tokenizer.encode(text[:start].strip()), tokenizer.encode(" " + last_word))


def cloze_rows(examples: list[ClozeExample], where: str) -> list[ScoreRow]:
    """One row per example, scoring the target's tokens.

    Raises:
        EvalDataError: an example without context or target tokens (naming its passage number).
    """
    rows = []
    for number, example in enumerate(examples, start=1):
        if not example.context or not example.target:
            raise EvalDataError(f"{where} passage {number}: no {'context' if not example.context else 'target'} "
                                "tokens to predict from")
        ids = np.array(example.context + example.target, dtype=np.int64)
        rows.append(ScoreRow(ids, first=len(example.context) - 1, last=len(ids) - 1))
    return rows


def score_cloze(model: EvalModel, examples: list[ClozeExample], where: str) -> LambadaResult:
    """Accuracy of ``examples`` (collective over the run's processes)."""
    scores = score_rows(model, cloze_rows(examples, where), where)
    hits = [s.greedy for s in scores]
    return LambadaResult(accuracy=sum(hits) / len(hits), correct=sum(hits), count=len(hits), hits=hits,
                         log_probs=[s.log_prob for s in scores])


def evaluate_lambada(model: EvalModel, path: str | Path, strict: bool) -> LambadaResult:
    """LAMBADA accuracy of the passages of a JSON-lines file (collective over the run's processes).

    Raises:
        EvalDataError: the file is malformed or a passage does not fit the model.
        TrainConfigError: the model has no tokenizer.
    """
    tokenizer = model.require_tokenizer("LAMBADA")
    examples = [cloze_example(text, tokenizer, strict) for text in read_lambada(path)]
    return score_cloze(model, examples, str(path))
