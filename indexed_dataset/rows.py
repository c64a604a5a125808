"""What the row-per-document formats (Arrow, MindRecord) share: the writers' batch checks, the
sequence structure of stored rows, the sequence-level reader base, and scalar pass-through fields.

Arrow and MindRecord store one *row per document* (`input_ids` = the document's tokens). A document
split into several sequences (sentence splitting) needs the option `store_sequence_lengths=True`,
which adds a `sequence_lengths` array per row; without it an empty row is a document with no sequence.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .errors import ShardFormatError, TokenmillError, TokenRangeError
from .protocol import DocumentBatch, SequenceCounts

# Documents decoded per step of a row format's full check.
VALIDATE_BLOCK_DOCUMENTS = 65536


def check_document_batch(
    tokens: np.ndarray,
    sequence_lengths: np.ndarray,
    document_sequence_counts: np.ndarray,
    dtype: np.dtype,
    name: str,
    first_document: int,
) -> DocumentBatch:
    """Validate a writer's input and range-check every id against `dtype`.

    Args:
        tokens: [N] integer ids.
        sequence_lengths: [S] tokens per sequence.
        document_sequence_counts: [D] sequences per document.
        dtype: the dataset's token dtype.
        name: the output's name, for messages.
        first_document: number of documents written before this batch, for messages.

    Returns:
        The batch with int64 counts.

    Raises:
        ValueError: the three arrays do not describe each other.
        TokenRangeError: an id does not fit `dtype`; names the document.
    """
    tokens = np.asarray(tokens)
    lengths = np.asarray(sequence_lengths, dtype=np.int64)
    counts = np.asarray(document_sequence_counts, dtype=np.int64)
    if tokens.ndim != 1 or lengths.ndim != 1 or counts.ndim != 1:
        raise ValueError(f"{name}: tokens, sequence lengths and document counts must be one-dimensional")
    if tokens.size and tokens.dtype.kind not in "iu":
        raise ValueError(f"{name}: token ids must be integers, got dtype {tokens.dtype}")
    if (lengths.size and lengths.min() < 0) or int(lengths.sum()) != len(tokens):
        raise ValueError(f"{name}: sequence lengths must be >= 0 and add up to the {len(tokens)} tokens")
    if (counts.size and counts.min() < 0) or int(counts.sum()) != len(lengths):
        raise ValueError(f"{name}: document sequence counts must be >= 0 and add up to {len(lengths)}")
    batch = DocumentBatch(tokens, lengths, counts)
    limits = np.iinfo(dtype)
    if tokens.size and (tokens.min() < limits.min or tokens.max() > limits.max):
        bad = int(np.flatnonzero((tokens < limits.min) | (tokens > limits.max))[0])
        document = int(np.searchsorted(batch.document_token_offsets(), bad, side="right")) - 1
        raise TokenRangeError(
            f"{name}: token id {tokens[bad]} in document {first_document + document} does not fit "
            f"{np.dtype(dtype).name} (range {limits.min}..{limits.max})"
        )
    return batch


def check_row_layout(batch: DocumentBatch, store_sequence_lengths: bool, name: str, first_document: int) -> None:
    """Refuse a batch whose sequence boundaries a row-per-document file without lengths would lose.

    Raises:
        TokenmillError: names the first such document.
    """
    if store_sequence_lengths or batch.has_one_sequence_per_document():
        return
    token_counts = np.diff(batch.document_token_offsets())
    bad = int(np.flatnonzero(batch.document_sequence_counts != (token_counts > 0))[0])
    raise TokenmillError(
        f"{name}: document {first_document + bad} has {batch.document_sequence_counts[bad]} sequences "
        f"({token_counts[bad]} tokens); a row per document keeps them only with store_sequence_lengths=True"
    )


def row_structure(
    name: str,
    row_token_counts: np.ndarray,
    row_sequence_lengths: np.ndarray | None,
    row_sequence_counts: np.ndarray | None,
) -> tuple[np.ndarray, np.ndarray]:
    """Sequence lengths and document indices of a row-per-document dataset, checked row by row.

    Args:
        name: the dataset's path, for messages.
        row_token_counts: int64 [D], tokens in each row.
        row_sequence_lengths: int [S], the stored per-row lengths concatenated, or None when not stored.
        row_sequence_counts: int64 [D], stored lengths per row (None when not stored).

    Returns:
        (sequence_lengths int32 [S], document_indices int64 [D+1]).

    Raises:
        ShardFormatError: a stored length is negative or too large for int32, or a row's stored lengths
            do not add up to its tokens (names the first such row).
    """
    if row_sequence_lengths is None:
        row_sequence_counts = (row_token_counts > 0).astype(np.int64)
        row_sequence_lengths = row_token_counts[row_token_counts > 0]
    row_sequence_lengths = np.asarray(row_sequence_lengths, dtype=np.int64)
    document_indices = np.zeros(len(row_token_counts) + 1, dtype=np.int64)
    np.cumsum(row_sequence_counts, out=document_indices[1:])
    out_of_range = np.flatnonzero((row_sequence_lengths < 0) | (row_sequence_lengths > np.iinfo(np.int32).max))
    if out_of_range.size:
        row = int(np.searchsorted(document_indices, out_of_range[0], side="right")) - 1
        raise ShardFormatError(
            f"{name}: row {row} stores sequence length {row_sequence_lengths[out_of_range[0]]} (must be 0..2**31-1)"
        )
    sequence_offsets = np.zeros(len(row_sequence_lengths) + 1, dtype=np.int64)
    np.cumsum(row_sequence_lengths, out=sequence_offsets[1:])
    mismatch = np.flatnonzero(np.diff(sequence_offsets[document_indices]) != row_token_counts)
    if mismatch.size:
        row = int(mismatch[0])
        raise ShardFormatError(
            f"{name}: row {row}'s sequence lengths add up to "
            f"{sequence_offsets[document_indices[row + 1]] - sequence_offsets[document_indices[row]]}, "
            f"but it holds {row_token_counts[row]} tokens"
        )
    return row_sequence_lengths.astype(np.int32), document_indices


class RowDocumentsReader(SequenceCounts, abc.ABC):
    """Sequence-level reading shared by the row-per-document readers (Arrow, MindRecord).

    Subclasses set `path`, `dtype`, `sequence_lengths` and `document_indices`, call `_build_offsets()`,
    and implement `read_rows`.
    """

    path: str
    dtype: np.dtype
    sequence_lengths: np.ndarray
    document_indices: np.ndarray

    def _build_offsets(self) -> None:
        self._sequence_offsets = np.zeros(len(self.sequence_lengths) + 1, dtype=np.int64)
        np.cumsum(self.sequence_lengths, out=self._sequence_offsets[1:])

    @abc.abstractmethod
    def read_rows(self, first: int, last: int) -> np.ndarray:
        """The tokens of rows `[first, last)`, concatenated."""

    def _check_token_range(self, tokens: np.ndarray, first: int, last: int) -> None:
        """Refuse stored ids outside `dtype` (rows store wider integers than the declared token dtype)."""
        if not tokens.size or np.can_cast(tokens.dtype, self.dtype):
            return
        limits = np.iinfo(self.dtype)
        low, high = tokens.min(), tokens.max()
        if low >= limits.min and high <= limits.max:
            return
        bad = int(np.flatnonzero((tokens < limits.min) | (tokens > limits.max))[0])
        offsets = self._sequence_offsets[self.document_indices[first : last + 1]]
        document = first + int(np.searchsorted(offsets - offsets[0], bad, side="right")) - 1
        raise ShardFormatError(
            f"{self.path}: token id {tokens[bad]} in document {document} does not fit the dataset's dtype "
            f"{self.dtype.name} (range {limits.min}..{limits.max})"
        )

    def validate(self, block_documents: int = VALIDATE_BLOCK_DOCUMENTS) -> None:
        """The full check: decode every row once, in blocks of `block_documents` (bounded memory); the
        readers check each row's framing and size, and every id against `dtype`.

        Raises:
            ShardFormatError: naming the file and the first problem found.
        """
        for first in range(0, self.num_documents, block_documents):
            self.read_documents(first, min(first + block_documents, self.num_documents))

    @property
    def num_tokens(self) -> int:
        return int(self._sequence_offsets[-1])

    def __getitem__(self, index: int | slice) -> np.ndarray | list[np.ndarray]:
        """Sequence `index` (a decoded copy), or a list of them for a step-1 slice."""
        if isinstance(index, slice):
            start, stop, step = index.indices(self.num_sequences)
            if step != 1:
                raise IndexError(f"{self.path}: slices with step {step} are not supported")
            if start >= stop:
                return []
            first_doc = int(np.searchsorted(self.document_indices, start, side="right")) - 1
            last_doc = int(np.searchsorted(self.document_indices, stop - 1, side="right"))
            batch = self.read_documents(first_doc, last_doc)
            offsets = self._sequence_offsets - self._sequence_offsets[self.document_indices[first_doc]]
            return [batch.tokens[offsets[i] : offsets[i + 1]] for i in range(start, stop)]
        index = int(index)
        if index < 0:
            index += self.num_sequences
        if not 0 <= index < self.num_sequences:
            raise IndexError(f"{self.path}: sequence {index} out of range [0, {self.num_sequences})")
        document = int(np.searchsorted(self.document_indices, index, side="right")) - 1
        tokens = self.read_rows(document, document + 1)
        start = self._sequence_offsets[index] - self._sequence_offsets[self.document_indices[document]]
        return tokens[start : start + self.sequence_lengths[index]].astype(self.dtype, copy=False)

    def document(self, index: int) -> np.ndarray:
        """All tokens of document `index`."""
        if not 0 <= index < self.num_documents:
            raise IndexError(f"{self.path}: document {index} out of range [0, {self.num_documents})")
        return self.read_documents(index, index + 1).tokens

    def read_documents(self, first: int, last: int) -> DocumentBatch:
        """Documents `[first, last)` in the writers' flat layout (tokens as `dtype`).

        Raises:
            ShardFormatError: a stored id does not fit `dtype` (never wrapped around silently).
        """
        tokens = self.read_rows(first, last)
        self._check_token_range(tokens, first, last)
        first_sequence, last_sequence = self.document_indices[first], self.document_indices[last]
        return DocumentBatch(
            tokens.astype(self.dtype, copy=False),
            self.sequence_lengths[first_sequence:last_sequence].astype(np.int64),
            np.diff(self.document_indices[first : last + 1]),
        )


# Scalar pass-through fields (`keep_fields`): the types both row formats can hold.
FIELD_TYPES = ("int32", "int64", "float32", "float64", "string")


def infer_field_types(fields: Mapping[str, Sequence[Any]]) -> dict[str, str]:
    """Field types from the first values given: int -> int64, float -> float64, str -> string.

    Raises:
        TokenmillError: a field is empty or holds another kind of value.
    """
    types = {}
    for name, values in fields.items():
        if len(values) == 0:
            raise TokenmillError(f"field {name!r}: cannot infer its type from no values")
        value = values[0]
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, str, np.integer, np.floating)):
            raise TokenmillError(f"field {name!r}: unsupported value {value!r}; fields hold int, float or str")
        if isinstance(value, str):
            types[name] = "string"
        else:
            types[name] = "float64" if isinstance(value, (float, np.floating)) else "int64"
    return types


def check_fields(
    fields: Mapping[str, Sequence[Any]] | None, field_types: Mapping[str, str], num_documents: int, name: str
) -> None:
    """Check that `fields` gives one value per document for exactly the declared fields.

    Raises:
        TokenmillError: a field is missing, unknown or has the wrong number of values.
    """
    given = set(fields or ())
    if given != set(field_types):
        raise TokenmillError(
            f"{name}: fields {sorted(given)} given, but the dataset holds {sorted(field_types)} "
            "(the first batch written fixes the field set)"
        )
    for field, values in (fields or {}).items():
        if len(values) != num_documents:
            raise TokenmillError(f"{name}: field {field!r} has {len(values)} values for {num_documents} documents")
