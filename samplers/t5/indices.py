"""T5 sample index: which whole sentences of which document each sample holds (no torch, no tokens read).

    index = build_t5_sample_index(dataset.document_indices, dataset.sequence_lengths, document_range=(0, 90),
                                  num_samples=None, max_seq_length=512, short_seq_prob=0.1, seed=1234)
    index[k]  # (first sentence id, one past the last sentence id, target length in tokens)

The walk is megatron-core's `helpers.build_mapping` with `min_num_sent=1` (what its T5 dataset
uses): for each document of the split, in order, whole sentences are appended to the current
sample until it reaches its target length or the document ends; the target is `max_seq_length`,
or, with probability about `short_seq_prob`, a random length in [2, max_seq_length]. Documents
with more than one sentence where a sentence is longer than `LONG_SENTENCE_LEN` tokens are skipped.
Epochs repeat the walk (with new target lengths) until `num_samples` are reached; then all samples
are shuffled together.

The random numbers are helpers.cpp's: std::mt19937(seed) draws the target lengths and
std::mt19937_64(seed + 1) drives the final Fisher-Yates shuffle, both written here as numba kernels,
so the index is megatron-core's `build_mapping(..., min_num_sent=1)` row for row (the tests hold
rows it produced). One deviation: a split whose documents yield no sample stops after one epoch
(helpers.cpp would walk the remaining ~2**31 empty epochs).
"""

from __future__ import annotations

from typing import Optional

import numba
import numpy as np

LONG_SENTENCE_LEN = 512
"""helpers.cpp skips multi-sentence documents holding a sentence longer than this (tokens)."""
MIN_SENTENCES_PER_SAMPLE = 1
"""megatron-core's T5 dataset builds its sample index with min_num_sent = 1."""
MIN_TARGET_LENGTH = 2
"""A short sample's target length is drawn from [2, max_seq_length], as helpers.cpp does."""
SHUFFLE_SEED_OFFSET = 1
"""The shuffle uses seed + 1 (helpers.cpp seeds its shuffle generator with seed + 1)."""
MAX_EPOCHS = 2**31 - 2
"""Megatron's bound on the epochs walked to reach `num_samples`."""
SAMPLE_INDEX_COLUMNS = 3
"""Columns of the sample index: first sentence, end sentence (exclusive), target length."""

# std::mt19937 (32-bit Mersenne Twister) and std::mt19937_64, as helpers.cpp uses them.
_MT32_N, _MT32_M = 624, 397
_MT32_MATRIX, _MT32_INIT = 0x9908B0DF, 1812433253
_MT64_N, _MT64_M = 312, 156
_MT64_MATRIX, _MT64_INIT = 0xB5026F5AA96619E9, 6364136223846793005
_MASK32 = 0xFFFFFFFF


def short_sequence_ratio(short_seq_prob: float) -> int:
    """helpers.cpp's integer ratio: a sample is short when a draw is divisible by it (0: never)."""
    return int(round(1.0 / short_seq_prob)) if short_seq_prob > 0 else 0


@numba.njit(cache=True, nogil=True)
def _mt32_seed(seed):
    """State of std::mt19937(seed): 624 words (uint64 holding 32-bit values) and the position."""
    mt = np.empty(_MT32_N + 1, np.uint64)  # the last slot holds the read position
    mt[0] = np.uint64(seed) & np.uint64(_MASK32)
    for i in range(1, _MT32_N):
        previous = mt[i - 1]
        mt[i] = (np.uint64(_MT32_INIT) * (previous ^ (previous >> np.uint64(30))) + np.uint64(i)) & np.uint64(_MASK32)
    mt[_MT32_N] = np.uint64(_MT32_N)
    return mt


@numba.njit(cache=True, nogil=True)
def _next_word(mt, n, m, upper, lower, matrix):
    """The next untempered word of a Mersenne Twister state of n words (+ read position), regenerating
    all n words when they are used up (the twist, same for the 32- and 64-bit engines)."""
    if mt[n] >= np.uint64(n):
        for k in range(n):
            y = (mt[k] & upper) | (mt[(k + 1) % n] & lower)
            mt[k] = mt[(k + m) % n] ^ (y >> np.uint64(1)) ^ (matrix if y & np.uint64(1) else np.uint64(0))
        mt[n] = np.uint64(0)
    word = mt[np.int64(mt[n])]
    mt[n] += np.uint64(1)
    return word


@numba.njit(cache=True, nogil=True)
def _mt32_next(mt):
    """Next 32-bit output of a `_mt32_seed` state (advanced in place)."""
    y = _next_word(mt, _MT32_N, _MT32_M, np.uint64(0x80000000), np.uint64(0x7FFFFFFF), np.uint64(_MT32_MATRIX))
    y ^= y >> np.uint64(11)
    y ^= (y << np.uint64(7)) & np.uint64(0x9D2C5680)
    y ^= (y << np.uint64(15)) & np.uint64(0xEFC60000)
    y ^= y >> np.uint64(18)
    return y & np.uint64(_MASK32)


@numba.njit(cache=True, nogil=True)
def _mt64_seed(seed):
    """State of std::mt19937_64(seed): 312 words and the read position."""
    mt = np.empty(_MT64_N + 1, np.uint64)
    mt[0] = np.uint64(seed)
    for i in range(1, _MT64_N):
        previous = mt[i - 1]
        mt[i] = np.uint64(_MT64_INIT) * (previous ^ (previous >> np.uint64(62))) + np.uint64(i)
    mt[_MT64_N] = np.uint64(_MT64_N)
    return mt


@numba.njit(cache=True, nogil=True)
def _mt64_next(mt):
    """Next 64-bit output of a `_mt64_seed` state (advanced in place)."""
    x = _next_word(mt, _MT64_N, _MT64_M, np.uint64(0xFFFFFFFF80000000), np.uint64(0x7FFFFFFF),
                   np.uint64(_MT64_MATRIX))
    x ^= (x >> np.uint64(29)) & np.uint64(0x5555555555555555)
    x ^= (x << np.uint64(17)) & np.uint64(0x71D67FFFEDA60000)
    x ^= (x << np.uint64(37)) & np.uint64(0xFFF7EEE000000000)
    x ^= x >> np.uint64(43)
    return x


@numba.njit(cache=True, nogil=True)
def _target_length(mt, short_ratio, max_seq_length):
    """max_seq_length, or 2 + draw % (max - 1) when the draw is divisible by the short ratio."""
    if short_ratio == 0:
        return max_seq_length
    draw = _mt32_next(mt)
    if draw % np.uint64(short_ratio) == np.uint64(0):
        return MIN_TARGET_LENGTH + np.int64(draw % np.uint64(max_seq_length - 1))
    return max_seq_length


@numba.njit(cache=True, nogil=True)
def shuffle_rows(index, seed):
    """helpers.cpp's final shuffle, in place: Fisher-Yates with std::mt19937_64(seed + 1)."""
    mt = _mt64_seed(seed + SHUFFLE_SEED_OFFSET)
    for i in range(index.shape[0] - 1, 0, -1):
        j = np.int64(_mt64_next(mt) % np.uint64(i + 1))
        for column in range(index.shape[1]):
            index[i, column], index[j, column] = index[j, column], index[i, column]


@numba.njit(cache=True, nogil=True)
def walk_t5_samples(document_indices, sequence_lengths, doc_begin, doc_end, num_samples, max_seq_length,
                    short_ratio, seed, out, min_sentences=MIN_SENTENCES_PER_SAMPLE):
    """Walk the documents of a split epoch after epoch; count samples, and fill `out` if it has rows.

    Args:
        document_indices: int64 [D + 1], sentence id where each document starts (then the total).
        sequence_lengths: int32 [S], tokens per sentence.
        doc_begin, doc_end: the split's documents [doc_begin, doc_end).
        num_samples: stop after the first epoch that brings the count to at least this (-1: one epoch).
        max_seq_length: the full target length in tokens (>= 2).
        short_ratio: `short_sequence_ratio(short_seq_prob)`.
        seed: seed of the target-length generator.
        out: int64 [n, 3] filled in walk order when n equals the count; pass [0, 3] to only count.
        min_sentences: helpers.cpp's ``min_num_sent``: documents with fewer sentences are skipped, and a
            sample closes early only once it holds this many (T5: 1; BERT with its binary head: 2).

    Returns:
        (number of samples, number of epochs walked).
    """
    mt = _mt32_seed(seed)
    fill = out.shape[0] > 0
    count = 0
    epoch = 0
    while epoch < MAX_EPOCHS:
        if num_samples < 0:
            if epoch == 1:
                break
        elif count >= num_samples:
            break
        epoch_start = count
        for doc in range(doc_begin, doc_end):
            first = document_indices[doc]
            last = document_indices[doc + 1]
            remaining = last - first
            if remaining < min_sentences:
                continue
            if remaining > 1:
                long_sentence = False
                for sentence in range(first, last):
                    if sequence_lengths[sentence] > LONG_SENTENCE_LEN:
                        long_sentence = True
                        break
                if long_sentence:
                    continue
            target = _target_length(mt, short_ratio, max_seq_length)
            start = first
            num_tokens = 0
            num_sentences = 0
            for sentence in range(first, last):
                num_tokens += sequence_lengths[sentence]
                num_sentences += 1
                remaining -= 1
                # helpers.cpp closes a sample early only if more than one sentence remains.
                if (num_tokens >= target and remaining > 1 and num_sentences >= min_sentences) \
                        or remaining == 0:
                    if fill:
                        out[count, 0] = start
                        out[count, 1] = sentence + 1
                        out[count, 2] = target
                    count += 1
                    start = sentence + 1
                    target = _target_length(mt, short_ratio, max_seq_length)
                    num_tokens = 0
                    num_sentences = 0
        epoch += 1
        if count == epoch_start:
            break  # the split yields no sample: more epochs would not either
    return count, epoch


def build_t5_sample_index(
    document_indices: np.ndarray,
    sequence_lengths: np.ndarray,
    document_range: tuple[int, int],
    num_samples: Optional[int],
    max_seq_length: int,
    short_seq_prob: float,
    seed: int,
    min_sentences: int = MIN_SENTENCES_PER_SAMPLE,
) -> np.ndarray:
    """The shuffled sample index of one split.

    Args:
        document_indices: int64 [D + 1] of the dataset.
        sequence_lengths: int32 [S] of the dataset (one sentence per sequence).
        document_range: the split's [begin, end) document ids.
        num_samples: samples wanted (whole epochs are walked until reached); None: one epoch.
        max_seq_length: target tokens per sample (>= 2).
        short_seq_prob: probability of a shorter random target length.
        seed: random seed.
        min_sentences: fewest sentences of a sample (helpers.cpp's ``min_num_sent``; BERT's binary head: 2).

    Returns:
        int64 [n, 3]: first sentence id, end sentence id (exclusive), target length; shuffled.
    """
    begin, end = document_range
    document_indices = np.asarray(document_indices, dtype=np.int64)
    wanted = -1 if num_samples is None else int(num_samples)
    ratio = short_sequence_ratio(short_seq_prob)
    count, _ = walk_t5_samples(document_indices, sequence_lengths, begin, end, wanted, max_seq_length, ratio, seed,
                               np.empty((0, SAMPLE_INDEX_COLUMNS), np.int64), min_sentences)
    index = np.empty((count, SAMPLE_INDEX_COLUMNS), np.int64)
    if count:
        walk_t5_samples(document_indices, sequence_lengths, begin, end, wanted, max_seq_length, ratio, seed, index,
                        min_sentences)
    shuffle_rows(index, seed)
    return index


def t5_walk_reference(
    document_indices: np.ndarray,
    sequence_lengths: np.ndarray,
    document_range: tuple[int, int],
    num_samples: Optional[int],
    max_seq_length: int,
    short_seq_prob: float,
    seed: int,
    min_sentences: int = MIN_SENTENCES_PER_SAMPLE,
) -> np.ndarray:
    """Plain-Python twin of the walk (the tests' oracle), before the shuffle: `build_t5_sample_index`
    equals `shuffle_rows(t5_walk_reference(...), seed)`.

    Written per document (a document's samples are cut from its cumulative sentence lengths), with
    the 32-bit draws taken from numpy's RandomState, whose integer seeding and raw outputs are
    std::mt19937's.
    """
    ratio = short_sequence_ratio(short_seq_prob)
    rng = np.random.RandomState(seed)

    def target() -> int:
        if ratio == 0:
            return max_seq_length
        draw = int(rng.randint(0, 2**32, dtype=np.uint32))
        return MIN_TARGET_LENGTH + draw % (max_seq_length - 1) if draw % ratio == 0 else max_seq_length

    rows: list[tuple[int, int, int]] = []
    epoch = 0
    while (num_samples is None and epoch < 1) or (num_samples is not None and len(rows) < num_samples):
        before = len(rows)
        for doc in range(*document_range):
            first, last = int(document_indices[doc]), int(document_indices[doc + 1])
            lengths = [int(n) for n in sequence_lengths[first:last]]
            if len(lengths) < min_sentences or (len(lengths) > 1 and max(lengths) > LONG_SENTENCE_LEN):
                continue
            start, goal = first, target()
            for sentence in range(first, last):
                tokens = sum(lengths[start - first : sentence - first + 1])
                enough = sentence - start + 1 >= min_sentences
                if (tokens >= goal and last - sentence - 1 > 1 and enough) or sentence == last - 1:
                    rows.append((start, sentence + 1, goal))
                    start, goal = sentence + 1, target()
        epoch += 1
        if len(rows) == before:
            break
    return np.array(rows, dtype=np.int64).reshape(-1, SAMPLE_INDEX_COLUMNS)
