"""What is inside a `.bin/.idx` pair: header, counts, length statistics, max token id, decoded text.

    from preprocess.inspect import inspect_dataset
    report = inspect_dataset("out/corpus_text_document")   # or the .bin/.idx path
    report.tokens, report.max_token_id, report.sequence_lengths.p99
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass

import numpy as np

from indexed_dataset import IndexedDataset, TokenmillError
from indexed_dataset.format import INDEX_VERSION

from .tokenizers import Tokenizer

P99 = 99


@dataclass(frozen=True)
class LengthStats:
    """Summary of a set of lengths, in tokens (all 0 for an empty set)."""

    min: int
    mean: float
    median: float
    p99: float
    max: int

    @classmethod
    def of(cls, lengths: np.ndarray) -> "LengthStats":
        if not len(lengths):
            return cls(0, 0.0, 0.0, 0.0, 0)
        return cls(int(lengths.min()), float(lengths.mean()), float(np.median(lengths)),
                   float(np.percentile(lengths, P99)), int(lengths.max()))


@dataclass(frozen=True)
class DatasetReport:
    """The facts `inspect-index` prints; `max_token_id` is -1 for a dataset without tokens."""

    prefix: str
    version: int
    dtype: str
    sequences: int
    documents: int
    empty_documents: int
    tokens: int
    sequence_lengths: LengthStats
    document_lengths: LengthStats
    max_token_id: int
    bin_bytes: int
    idx_bytes: int

    def as_dict(self) -> dict:
        return asdict(self)


def document_token_counts(dataset: IndexedDataset) -> np.ndarray:
    """int64 [D], tokens per document (sum of its sequences' lengths)."""
    cumulative = np.zeros(dataset.num_sequences + 1, dtype=np.int64)
    np.cumsum(dataset.sequence_lengths, out=cumulative[1:])
    return np.diff(cumulative[dataset.document_indices])


def inspect_dataset(path: str) -> DatasetReport:
    """Read a dataset's header and arrays and summarise them (one pass over `.bin` for the max id).

    Raises:
        IndexFormatError: a file is missing or damaged.
    """
    dataset = IndexedDataset(path)
    documents = document_token_counts(dataset)
    return DatasetReport(
        prefix=dataset.prefix,
        version=INDEX_VERSION,
        dtype=dataset.dtype.name,
        sequences=dataset.num_sequences,
        documents=dataset.num_documents,
        empty_documents=int(np.count_nonzero(documents == 0)),
        tokens=int(dataset.num_tokens),
        sequence_lengths=LengthStats.of(dataset.sequence_lengths),
        document_lengths=LengthStats.of(documents),
        max_token_id=int(dataset.tokens.max()) if len(dataset.tokens) else -1,
        bin_bytes=os.path.getsize(dataset.bin_path),
        idx_bytes=os.path.getsize(dataset.idx_path),
    )


def validate_dataset(path: str, tokenizer: Tokenizer | None = None) -> None:
    """The full consistency check, plus (with a tokenizer) every id below its vocab_size.

    Raises:
        IndexFormatError: the files are damaged or inconsistent.
        TokenmillError: a token id is outside the tokenizer's vocabulary.
    """
    dataset = IndexedDataset(path)
    dataset.validate()
    if tokenizer is not None and len(dataset.tokens):
        max_id = int(dataset.tokens.max())
        if max_id >= tokenizer.vocab_size:
            raise TokenmillError(
                f"{dataset.bin_path}: token id {max_id} >= the tokenizer's vocab size {tokenizer.vocab_size}"
            )


def decode_documents(path: str, tokenizer: Tokenizer, indices: list[int]) -> dict[int, str]:
    """The text of each listed document.

    Raises:
        TokenmillError: a document index is out of range.
    """
    dataset = IndexedDataset(path)
    for index in indices:
        if not 0 <= index < dataset.num_documents:
            raise TokenmillError(f"{dataset.prefix}: document {index} out of range [0, {dataset.num_documents})")
    return {index: tokenizer.decode(dataset.document(index)) for index in indices}
