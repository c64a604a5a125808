"""T5 span corruption of one sample: choose noise spans, replace each by a sentinel, list them as the target.

    rng = np.random.RandomState(1234)
    noise = random_spans_noise_mask(len(tokens), noise_density=0.15, mean_span_length=3.0, rng=rng)
    encoder_tokens, target_tokens = corrupt_spans(tokens, noise, sentinel_ids)

    tokens  = [a b c d e f g]             noise = [0 1 1 0 0 1 0]
    encoder = [a <X0> d e <X1> g]         target = [<X0> b c <X1> f]

The noise mask is the T5 paper's (`random_spans_noise_mask` of the T5 code base, used by Hugging
Face's T5/mT5 pre-training scripts): exactly round(length x density) noise tokens (at least 1, at
most length - 1) in round(noise / mean span length) spans (at least 1); the lengths of the noise
spans and of the kept spans between them are uniformly random segmentations; a sample starts with
kept tokens. Megatron's masked dataset instead draws WordPiece whole-word n-grams (geometric
lengths, p = 0.2, at most 10): that needs "##" continuation pieces, so it does not apply to
SentencePiece or byte-level vocabularies, and it does not hit the noise density exactly.
"""

from __future__ import annotations

import numpy as np


def noise_span_counts(length: int | np.ndarray, noise_density: float, mean_span_length: float):
    """Noise tokens and noise spans of a sample of `length` tokens (vectorised over lengths).

    Returns:
        (num_noise_tokens, num_noise_spans), int64 like `length`; both 0 for a sample under 2 tokens.
    """
    length = np.asarray(length, dtype=np.int64)
    noise = np.clip(np.round(length * noise_density).astype(np.int64), 1, np.maximum(length - 1, 1))
    spans = np.maximum(np.round(noise / mean_span_length).astype(np.int64), 1)
    # Every noise span is preceded by at least one kept token.
    spans = np.minimum(spans, length - noise)
    too_short = length < 2
    return np.where(too_short, 0, noise), np.where(too_short, 0, spans)


def _random_segmentation(num_items: int, num_segments: int, rng: np.random.RandomState) -> np.ndarray:
    """Lengths (int64 [num_segments], each >= 1, sum num_items) of a uniformly random segmentation."""
    first_in_segment = np.arange(num_items - 1) < num_segments - 1
    rng.shuffle(first_in_segment)
    segment_id = np.concatenate(([0], np.cumsum(first_in_segment)))
    return np.bincount(segment_id, minlength=num_segments).astype(np.int64)


def random_spans_noise_mask(length: int, noise_density: float, mean_span_length: float,
                            rng: np.random.RandomState) -> np.ndarray:
    """Which tokens of a sample are noise.

    Args:
        length: tokens in the sample.
        noise_density: fraction of tokens to corrupt (0.15 in T5).
        mean_span_length: average tokens per noise span (3 in T5).
        rng: the sample's random state (consumed: two shuffles).

    Returns:
        bool [length]; all False when length < 2.
    """
    num_noise, num_spans = (int(n) for n in noise_span_counts(length, noise_density, mean_span_length))
    if num_spans == 0:
        return np.zeros(length, dtype=bool)
    noise_lengths = _random_segmentation(num_noise, num_spans, rng)
    kept_lengths = _random_segmentation(length - num_noise, num_spans, rng)
    # Alternate kept, noise, kept, noise, ...: span k covers [starts[2k+1], starts[2k+2]).
    boundaries = np.cumsum(np.stack([kept_lengths, noise_lengths], axis=1).reshape(-1))
    span_starts = np.zeros(length, dtype=np.int64)
    span_starts[boundaries[:-1]] = 1
    return np.cumsum(span_starts) % 2 == 1


def corrupt_spans(tokens: np.ndarray, noise_mask: np.ndarray,
                  sentinel_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Encoder input and decoder target of a sample with the given noise.

    Args:
        tokens: int64 [n], the sample's tokens.
        noise_mask: bool [n].
        sentinel_ids: int64 [>= number of spans], the id replacing span k is sentinel_ids[k].

    Returns:
        encoder input int64 [n - noise + spans]: kept tokens, one sentinel per span;
        target int64 [noise + spans]: each sentinel followed by the tokens it replaced.

    Raises:
        ValueError: more spans than sentinel ids.
    """
    tokens = np.asarray(tokens, dtype=np.int64)
    previous = np.concatenate(([False], noise_mask[:-1]))
    span_start = noise_mask & ~previous
    num_spans = int(span_start.sum())
    if num_spans > len(sentinel_ids):
        raise ValueError(f"{num_spans} noise spans but only {len(sentinel_ids)} sentinel ids")
    sentinels = np.asarray(sentinel_ids, dtype=np.int64)[:num_spans]
    encoder = np.where(span_start, 0, tokens)
    encoder[span_start] = sentinels
    encoder = encoder[~noise_mask | span_start]
    noise_positions = np.flatnonzero(noise_mask)
    starts_within_noise = np.searchsorted(noise_positions, np.flatnonzero(span_start))
    target = np.insert(tokens[noise_mask], starts_within_noise, sentinels)
    return encoder, target
