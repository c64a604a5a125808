"""What every token format's reader and writer share, whatever the bytes on disk.

A writer appends documents (`add_documents(tokens, sequence_lengths, document_sequence_counts)`) and is
atomic: `finalize()` moves finished files into place, `abort()` leaves the final paths untouched, and as a
context manager it finalizes on success and aborts on an exception. A reader exposes `sequence_lengths`
(int [S]) and `document_indices` (int64 [D + 1]); the counts below follow from those two arrays.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .errors import TokenmillError


@dataclass(frozen=True)
class DocumentBatch:
    """Consecutive documents in the writers' flat layout.

    Attributes:
        tokens: [N] token ids of every sequence, concatenated.
        sequence_lengths: int64 [S], tokens per sequence (sums to N).
        document_sequence_counts: int64 [D], sequences per document (sums to S; 0 = empty document).
    """

    tokens: np.ndarray
    sequence_lengths: np.ndarray
    document_sequence_counts: np.ndarray

    @property
    def num_documents(self) -> int:
        return len(self.document_sequence_counts)

    def document_token_offsets(self) -> np.ndarray:
        """int64 [D+1]: where each document starts in `tokens` (last entry N)."""
        sequence_offsets = np.zeros(len(self.sequence_lengths) + 1, dtype=np.int64)
        np.cumsum(self.sequence_lengths, out=sequence_offsets[1:])
        first_sequences = np.zeros(self.num_documents + 1, dtype=np.int64)
        np.cumsum(self.document_sequence_counts, out=first_sequences[1:])
        return sequence_offsets[first_sequences]

    def has_one_sequence_per_document(self) -> bool:
        return has_one_sequence_per_document(self.sequence_lengths, self.document_sequence_counts)

    def documents(self, first: int, last: int) -> "DocumentBatch":
        """Documents `[first, last)` of this batch (views, no copy)."""
        first_sequences = np.zeros(self.num_documents + 1, dtype=np.int64)
        np.cumsum(self.document_sequence_counts, out=first_sequences[1:])
        offsets = self.document_token_offsets()
        return DocumentBatch(
            self.tokens[offsets[first] : offsets[last]],
            self.sequence_lengths[first_sequences[first] : first_sequences[last]],
            self.document_sequence_counts[first:last],
        )


def has_one_sequence_per_document(sequence_lengths: np.ndarray, document_sequence_counts: np.ndarray) -> bool:
    """True when a row-per-document layout keeps every boundary without a `sequence_lengths` field:
    each non-empty document is one sequence and each empty document has none.

    Args:
        sequence_lengths: int [S] tokens per sequence.
        document_sequence_counts: int [D] sequences per document.
    """
    sequence_offsets = np.zeros(len(sequence_lengths) + 1, dtype=np.int64)
    np.cumsum(sequence_lengths, out=sequence_offsets[1:])
    first_sequences = np.zeros(len(document_sequence_counts) + 1, dtype=np.int64)
    np.cumsum(document_sequence_counts, out=first_sequences[1:])
    token_counts = np.diff(sequence_offsets[first_sequences])
    return bool(np.array_equal(document_sequence_counts, (token_counts > 0).astype(document_sequence_counts.dtype)))


class SequenceCounts:
    """Counts derived from `sequence_lengths` and `document_indices` (set by the reader)."""

    sequence_lengths: np.ndarray
    document_indices: np.ndarray

    @property
    def num_sequences(self) -> int:
        """Number of sequences S (sentences with sentence splitting, else documents)."""
        return len(self.sequence_lengths)

    @property
    def num_documents(self) -> int:
        """Number of documents D (the document index holds D + 1 entries)."""
        return len(self.document_indices) - 1

    def __len__(self) -> int:
        return self.num_sequences


class TokenWriter(abc.ABC):
    """The streaming, atomic writer protocol. Subclasses set `path`, implement `add_documents`, `_finish`
    (write what is buffered and rename every file into place) and `_discard` (remove the temporaries)."""

    path: str
    _closed: bool = False

    def add_document(self, ids: Sequence[int] | np.ndarray, lengths: Sequence[int] | np.ndarray) -> None:
        """Append one document made of `len(lengths)` sequences whose tokens are `ids`, concatenated."""
        self.add_documents(np.asarray(ids), np.asarray(lengths, dtype=np.int64), np.array([len(lengths)]))

    @abc.abstractmethod
    def add_documents(
        self, tokens: np.ndarray, sequence_lengths: np.ndarray, document_sequence_counts: np.ndarray
    ) -> None:
        """Append many documents: flat tokens, per-sequence lengths, per-document sequence counts."""

    @abc.abstractmethod
    def _finish(self) -> None:
        """Write what is still buffered and move every file to its final name."""

    @abc.abstractmethod
    def _discard(self) -> None:
        """Remove every temporary file."""

    def _check_open(self) -> None:
        if self._closed:
            raise TokenmillError(f"{self.path}: writer already closed")

    def finalize(self) -> None:
        """Finish the dataset; if that fails, nothing is left under the final names."""
        self._check_open()
        try:
            self._finish()
        except BaseException:
            self.abort()
            raise
        self._closed = True

    def abort(self) -> None:
        """Drop everything written so far; the final paths are left untouched."""
        if self._closed:
            return
        self._closed = True
        self._discard()

    def __enter__(self) -> "TokenWriter":
        return self

    def __exit__(self, exc_type, exc, traceback) -> None:
        if exc_type is None:
            self.finalize()
        else:
            self.abort()
