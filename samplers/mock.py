"""Megatron's mock GPT data (``--mock-data``): megatron-core's `MockGPTLowLevelDataset` as a token source, which
the GPT index machinery reads where it reads a `TokenSource` (no files).

    source = MockTokenSource(vocab_size=50257, eod_id=50256)
    source.sequence_lengths          # int32 [100000]: lengths in [1, 4095], drawn with seed 0
    source.get(7, offset=3, length=5)   # int64: tokens 4, 5, 6, 7, 8 of document 7

Document d (one sequence each) of length n holds the tokens ``1, 2, ..., n - 1`` modulo the vocabulary size,
then the EOD id, as megatron-core 0.16.1's gpt_dataset.py builds them. Megatron divides the documents 1,1,1
among train, valid and test whatever ``--split`` says (its `BlendedMegatronDatasetConfig` replaces the split
when no blend is given), and keeps their index arrays in memory unless given a cache directory.
"""

from __future__ import annotations

import numpy as np

MOCK_NAME = "mock-data"
"""The source's name in logs, cache file names and token locations."""
MOCK_SEED = 0
"""Megatron's hard-coded seed of the `numpy.random.default_rng` that draws the lengths."""
MOCK_NUM_DOCUMENTS = 100_000
"""Megatron's hard-coded number of documents."""
MOCK_MAX_SEQUENCE_LENGTH = 4096
"""Megatron's exclusive upper bound of the lengths (they are drawn from [1, 4096))."""
MOCK_MIN_SEQUENCE_LENGTH = 1
MOCK_SPLIT = "1,1,1"
"""The split Megatron uses for mock data, "an arbitrarily even split"."""


class MockTokenSource:
    """The 100000 synthetic documents of Megatron's mock data, each one sequence.

    Args:
        vocab_size: the tokenizer's vocabulary size; the tokens count modulo it.
        eod_id: the tokenizer's end-of-document id, the last token of every document.

    Attributes:
        prefix: `MOCK_NAME`.
        sequence_lengths: int32 [100000] tokens per sequence.
        document_indices: int64 [100001] first sequence of each document (documents are single sequences).
    """

    def __init__(self, vocab_size: int, eod_id: int) -> None:
        self.vocab_size = vocab_size
        self.eod_id = eod_id
        self.prefix = MOCK_NAME
        self.dtype = np.dtype(np.int64)
        rng = np.random.default_rng(seed=MOCK_SEED)
        self.sequence_lengths = rng.integers(low=MOCK_MIN_SEQUENCE_LENGTH, high=MOCK_MAX_SEQUENCE_LENGTH,
                                             size=MOCK_NUM_DOCUMENTS, dtype=np.int32)
        self.document_indices = np.arange(MOCK_NUM_DOCUMENTS + 1, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.sequence_lengths)

    @property
    def num_documents(self) -> int:
        return len(self.document_indices) - 1

    def fingerprint(self) -> dict[str, object]:
        """What the lengths, and so the index arrays, depend on (the cache key; the tokens do not enter it)."""
        return {"mock": "MockGPTLowLevelDataset", "seed": MOCK_SEED, "num_documents": MOCK_NUM_DOCUMENTS,
                "max_sequence_length": MOCK_MAX_SEQUENCE_LENGTH}

    def get(self, index: int, offset: int = 0, length: int | None = None) -> np.ndarray:
        """Tokens `[offset, offset + length)` of document `index` (to its end when length is None), int64.

        Raises:
            IndexError: the document or the token range is out of bounds.
        """
        if not 0 <= index < len(self):
            raise IndexError(f"{self.prefix}: document {index} outside [0, {len(self)})")
        size = int(self.sequence_lengths[index])
        end = size if length is None else offset + length
        if offset < 0 or end < offset or end > size:
            raise IndexError(f"{self.prefix}: tokens [{offset}, {end}) outside document {index} of length {size}")
        tokens = (np.arange(offset, end, dtype=np.int64) + 1) % self.vocab_size
        if end == size and end > offset:
            tokens[-1] = self.eod_id
        return tokens

    def __repr__(self) -> str:
        return f"MockTokenSource(vocab_size={self.vocab_size}, eod_id={self.eod_id})"
