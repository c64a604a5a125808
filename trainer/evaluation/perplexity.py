"""Perplexity with Megatron-LM's overlapping windows, and WikiText's word-level adjusted perplexity.

Megatron's ``_LMDataset``: the token stream is cut into windows of ``seq_len`` inputs starting every
``overlapping_eval`` tokens; the first window scores all its targets, every later one only its last
``overlapping_eval`` (the rest is context), so each target is scored exactly once with up to
``seq_len - overlapping_eval`` tokens of context. Without overlap (``overlapping_eval = seq_len``) the
windows are disjoint. The mean loss over all ``num_tokens - 1`` targets gives the perplexity; for a text
file, the adjusted perplexity scales that loss by ``(num_tokens - 1) / (num_words - 1)`` where the words
are the original (not detokenised) text split on single spaces, as Megatron reports for WikiText-103.

    with open_eval_model(EvalModelConfig(load="gpt2/")) as model:
        result = evaluate_perplexity(model, "wiki.test.tokens", seq_len=1024, overlapping_eval=32)
    result.ppl, result.adjusted_ppl
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from indexed_dataset.format import index_file_path, strip_suffix
from indexed_dataset.reader import IndexedDataset
from trainer.errors import TrainConfigError
from trainer.evaluation.detokenize import AUTO, detokenizer_for
from trainer.evaluation.scoring import EvalDataError, EvalModel, ScoreRow, score_rows


@dataclass(frozen=True, slots=True)
class PerplexityResult:
    """Megatron's figures for one token stream."""

    num_tokens: int
    """Tokens of the (detokenised, tokenised) stream; ``num_tokens - 1`` targets were scored."""
    num_original_tokens: int | None
    """Space-separated words of the original text; None for a token file."""
    avg_loss: float
    """Mean negative log-likelihood per target token (nats)."""
    ppl: float
    adjusted_ppl: float | None
    """Word-level perplexity ``exp(avg_loss * token_ratio)``; None for a token file."""
    token_ratio: float | None


def lm_windows(tokens: np.ndarray, seq_len: int, overlapping_eval: int, pad_id: int) -> list[ScoreRow]:
    """Megatron's evaluation windows over a token stream (``_LMDataset.__getitem__``).

    Args:
        tokens: int64 [num_tokens] the stream.
        seq_len: inputs per window.
        overlapping_eval: targets newly scored per window after the first (clamped to [1, seq_len]).
        pad_id: id filling the last window up to ``seq_len + 1`` (never scored).
    """
    stride = min(max(1, overlapping_eval), seq_len)
    total_targets = len(tokens) - 1
    count = max(math.ceil(max(total_targets - stride, 0) / stride) + 1, 1)
    rows = []
    for index in range(count):
        ids = tokens[index * stride:index * stride + seq_len + 1]
        real_targets = len(ids) - 1
        if len(ids) < seq_len + 1:
            ids = np.concatenate([ids, np.full(seq_len + 1 - len(ids), pad_id, dtype=np.int64)])
        first = 0 if index == 0 or stride == seq_len else seq_len - stride
        rows.append(ScoreRow(ids.astype(np.int64, copy=False), first=first, last=max(first, real_targets)))
    return rows


def _exp(loss: float) -> float:
    """``exp`` that overflows to inf (a random model's loss can exceed 709 nats per token only in theory,
    but a result is never an exception)."""
    try:
        return math.exp(loss)
    except OverflowError:
        return math.inf


def perplexity_of(model: EvalModel, tokens: np.ndarray, seq_len: int, overlapping_eval: int,
                  num_original_tokens: int | None, where: str) -> PerplexityResult:
    """Perplexity of a token stream (collective over the run's processes).

    Raises:
        EvalDataError: fewer than two tokens, or a token id outside the model's vocabulary.
    """
    if len(tokens) < 2:
        raise EvalDataError(f"{where}: {len(tokens)} token(s); perplexity needs at least 2")
    pad_id = model.eod_id if model.eod_id is not None else 0
    scores = score_rows(model, lm_windows(tokens, seq_len, overlapping_eval, pad_id), where, greedy=False)
    scored = sum(s.count for s in scores)
    # Every target is scored exactly once (the windows tile the stream); a mismatch is our own bug.
    assert scored == len(tokens) - 1, f"scored {scored} of {len(tokens) - 1} targets"
    avg_loss = -sum(s.log_prob for s in scores) / scored
    ratio = adjusted = None
    if num_original_tokens is not None and num_original_tokens > 1:
        ratio = scored / (num_original_tokens - 1)
        adjusted = _exp(avg_loss * ratio)
    return PerplexityResult(num_tokens=len(tokens), num_original_tokens=num_original_tokens, avg_loss=avg_loss,
                            ppl=_exp(avg_loss), adjusted_ppl=adjusted, token_ratio=ratio)


def is_token_file(path: str | os.PathLike) -> bool:
    """Whether ``path`` names a Megatron ``.bin/.idx`` pair (by prefix, ``.bin`` or ``.idx`` path)."""
    return os.path.isfile(index_file_path(strip_suffix(str(path))))


def read_text_stream(model: EvalModel, path: str | os.PathLike, detokenizer: str) -> tuple[np.ndarray, int]:
    """A text file's tokens after detokenising, and its original space-separated word count (Megatron's
    ``_build_wikitext103_dataset``: the whole file is one string).

    Raises:
        EvalDataError: unreadable file.
        TrainConfigError: the model has no tokenizer.
    """
    tokenizer = model.require_tokenizer("perplexity of a text file")
    try:
        text = Path(path).read_bytes().decode("utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise EvalDataError(f"{path}: cannot read ({error})") from None
    num_original = len(text.strip().split(" "))
    tokens = tokenizer.encode(detokenizer_for(str(path), detokenizer)(text))
    return np.asarray(tokens, dtype=np.int64), num_original


def evaluate_perplexity(model: EvalModel, path: str | os.PathLike, seq_len: int | None = None,
                        overlapping_eval: int | None = None, detokenizer: str = AUTO) -> PerplexityResult:
    """Perplexity of a text file, or of a token file's whole token stream (collective over the run's processes).

    Args:
        seq_len: inputs per window (default: the model's positions).
        overlapping_eval: targets scored per window after the first (default: ``seq_len``, disjoint windows).
        detokenizer: `trainer.evaluation.detokenize` name, or ``auto`` (by file name, as Megatron).

    Raises:
        EvalDataError: unreadable or too short data.
        TrainConfigError: ``seq_len`` or ``overlapping_eval`` out of range; text without a tokenizer.
    """
    seq_len = seq_len or model.max_positions
    if not 1 <= seq_len <= model.max_positions:
        raise TrainConfigError(f"seq_length ({seq_len}) must be in [1, {model.max_positions}] (the model's positions)")
    overlapping_eval = overlapping_eval or seq_len
    if not 1 <= overlapping_eval <= seq_len:
        raise TrainConfigError(f"overlapping_eval ({overlapping_eval}) must be in [1, seq_length ({seq_len})]")
    if is_token_file(path):
        tokens, num_original = np.asarray(IndexedDataset(str(path)).tokens, dtype=np.int64), None
    else:
        tokens, num_original = read_text_stream(model, path, detokenizer)
    return perplexity_of(model, tokens, seq_len, overlapping_eval, num_original, str(path))
