"""Megatron's masked-LM choice for one BERT sample: whole-word n-grams of WordPiece tokens, 80/10/10.

    masked, positions, labels = mask_tokens(tokens, MaskingOptions(...), rng)

megatron-core 0.16's `MaskedWordPieceDataset._create_masked_lm_predictions` and
`BERTMaskedWordPieceDataset._get_token_mask`, draw for draw on the sample's RandomState:

- candidates are the words of the sample: a piece starting with ``##`` joins the word before it
  (whole-word masking), [CLS] and [SEP] are never candidates;
- at most min(p x target length, max(1, round(p x tokens))) tokens are masked (p = masking probability);
- the candidates are shuffled; each in turn draws an n-gram length n (P(n) proportional to 1/n, n <= 3,
  or geometric with p = 0.2 as SpanBERT), shortens it until it fits the budget, and masks the n words
  from it unless one of their tokens is already masked;
- each masked token becomes [MASK] (80%), a uniformly random id (10%) or stays itself (10%).

Megatron's permutation option (`masking_do_permutation`) is not reproduced: pretrain_bert.py leaves it off.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

CONTINUATION_PREFIX = "##"
"""WordPiece's mark of a piece that continues the word before it."""
MASK_TOKEN_PROBABILITY = 0.8
"""A masked token becomes [MASK] with this probability ..."""
RANDOM_TOKEN_SHARE = 0.5
"""... else a random id with this probability (10% overall), else it stays itself."""
GEOMETRIC_P = 0.2
"""SpanBERT's geometric n-gram length parameter (Section 3.1), Megatron's too."""


@dataclass(frozen=True, slots=True)
class MaskingOptions:
    """What the masking of a sample needs (megatron-core's MaskedWordPieceDatasetConfig fields)."""

    cls_id: int
    sep_id: int
    mask_id: int
    continuation: np.ndarray
    """bool [vocabulary]: whether id i's piece starts with ``##``."""
    random_token_count: int
    """Random replacements are drawn uniformly from ids [0, random_token_count) (Megatron: its tokenizer's
    inverse vocabulary, added [BOS]/[EOS] included)."""
    masking_probability: float = 0.15
    max_ngram: int = 3
    whole_word: bool = True
    longer_ngrams: bool = False
    geometric: bool = False


def word_candidates(tokens: list[int], options: MaskingOptions) -> list[list[int]]:
    """Positions of each maskable word (or piece, without whole-word masking), in order."""
    candidates: list[list[int]] = []
    for position, token in enumerate(tokens):
        if token in (options.cls_id, options.sep_id):
            continue
        if options.continuation[token] and options.whole_word and candidates:
            candidates[-1].append(position)
        else:
            candidates.append([position])
    return candidates


def _replacement(token: int, options: MaskingOptions, rng: np.random.RandomState) -> int:
    """What a masked token becomes (80/10/10)."""
    if rng.random() < MASK_TOKEN_PROBABILITY:
        return options.mask_id
    if rng.random() >= RANDOM_TOKEN_SHARE:
        return int(rng.randint(0, options.random_token_count))
    return token


def mask_tokens(tokens: list[int], target_length: int, options: MaskingOptions,
                rng: np.random.RandomState) -> tuple[list[int], list[int], list[int]]:
    """Megatron's masked-LM predictions of one sample.

    Args:
        tokens: the sample's ids, [CLS] A [SEP] B [SEP].
        target_length: the sample's target length (from the sample index).
        options: masking options.
        rng: the sample's RandomState, after the segment draws.

    Returns:
        (the ids with masking applied, masked positions ascending, their original ids).
    """
    candidates = word_candidates(tokens, options)
    budget = min(options.masking_probability * target_length,
                 max(1, int(round(len(tokens) * options.masking_probability))))
    lengths = np.arange(options.max_ngram, dtype=np.int64) + 1
    probabilities = 1.0 / lengths
    probabilities = probabilities / probabilities.sum(keepdims=True)
    if options.longer_ngrams:
        probabilities = probabilities[::-1]
    ngrams = [[candidates[i : i + n] for n in lengths] for i in range(len(candidates))]
    rng.shuffle(ngrams)
    masked = list(tokens)
    chosen: list[tuple[int, int]] = []
    taken: set[int] = set()
    for options_of_candidate in ngrams:
        if len(chosen) >= budget:
            break
        count = len(options_of_candidate)
        if options.geometric:
            n = min(rng.geometric(GEOMETRIC_P), options.max_ngram)
        else:
            p = probabilities[:count] / probabilities[:count].sum(keepdims=True)
            n = rng.choice(lengths[:count], p=p)
        while True:
            positions = sum(options_of_candidate[n - 1], [])
            n -= 1
            if budget >= len(chosen) + len(positions):
                break
            if n == 0:
                positions = None
                break
        if positions is None or any(position in taken for position in positions):
            continue
        for position in positions:
            taken.add(position)
            masked[position] = _replacement(tokens[position], options, rng)
            chosen.append((position, tokens[position]))
    chosen.sort()
    return masked, [position for position, _ in chosen], [label for _, label in chosen]


def masking_options(pieces: list[str], masking_probability: float = 0.15, **options) -> MaskingOptions:
    """Masking options of a WordPiece vocabulary.

    Args:
        pieces: the piece of every id, in id order, as Megatron's tokenizer holds them (the vocabulary file,
            then the pieces it appends: [BOS], [EOS]); random replacements are drawn from all of them.
        masking_probability: fraction of a sample's tokens masked.
        options: further `MaskingOptions` fields (max_ngram, whole_word, longer_ngrams, geometric).

    Raises:
        ValueError: the vocabulary lacks [CLS], [SEP] or [MASK].
    """
    ids = {piece: i for i, piece in enumerate(pieces)}
    missing = [piece for piece in ("[CLS]", "[SEP]", "[MASK]") if piece not in ids]
    if missing:
        raise ValueError(f"a BERT vocabulary needs the pieces {', '.join(missing)}")
    continuation = np.array([piece.startswith(CONTINUATION_PREFIX) for piece in pieces], dtype=bool)
    return MaskingOptions(cls_id=ids["[CLS]"], sep_id=ids["[SEP]"], mask_id=ids["[MASK]"], continuation=continuation,
                          random_token_count=len(pieces), masking_probability=masking_probability, **options)
