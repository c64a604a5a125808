"""The token shard formats side by side: one registry and the document protocol they share.

    from indexed_dataset.formats import open_reader, open_writer
    with open_writer("arrow", "out/corpus_arrow", np.uint16) as writer:   # or "mmap", "mindrecord"
        writer.add_documents(tokens, sequence_lengths, document_sequence_counts)
    reader = open_reader("out/corpus_arrow")   # the format is detected from the path
    reader.sequence_lengths, reader.document_indices, reader[0]

Every writer takes `(prefix_or_path, dtype, **options)` and has `add_documents(tokens,
sequence_lengths, document_sequence_counts)`, `add_document(ids, lengths)`, `finalize()`, `abort()`
and the context-manager behaviour of `IndexedDatasetWriter`. Every reader exposes `sequence_lengths`
(int32 [S]), `document_indices` (int64 [D+1]), `len()`, `reader[i]`, `dtype` and `num_tokens`.

Arrow and MindRecord store one *row per document* (`input_ids` = the document's tokens). A document
split into several sequences (sentence splitting) needs the option `store_sequence_lengths=True`,
which adds a `sequence_lengths` array per row; without it an empty row is a document with no sequence.
"""

from __future__ import annotations

import abc
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .errors import ShardFormatError, TokenmillError, TokenRangeError
from .protocol import DocumentBatch, SequenceCounts, has_one_sequence_per_document
from .reader import IndexedDataset
from .writer import IndexedDatasetWriter

FORMATS = ("mmap", "arrow", "mindrecord")
ARROW_STATE_FILE = "state.json"
# How a dataset of each format is named after a stem (what preprocess-data and merge-datasets write).
ARROW_FOLDER_SUFFIX = "_arrow"
MINDRECORD_SUFFIX = ".mindrecord"
# Beside every MindRecord data file: its SQLite index, `<data file>.db`.
MINDRECORD_INDEX_SUFFIX = ".db"
# Documents decoded per step of a row format's full check.
VALIDATE_BLOCK_DOCUMENTS = 65536
_MINDRECORD_NAME = re.compile(r"\.mindrecord\d*$")


def is_mindrecord_name(path: str) -> bool:
    """Whether `path` names a MindRecord data file (`x.mindrecord`, or shard `x.mindrecordN`)."""
    return _MINDRECORD_NAME.search(str(path)) is not None


def dataset_path(fmt: str, stem: str) -> str:
    """The path of the dataset of format `fmt` named after `stem` (`x_text_document`): the prefix itself
    for mmap, `stem_arrow` for Arrow, `stem.mindrecord` for MindRecord."""
    suffixes = {"mmap": "", "arrow": ARROW_FOLDER_SUFFIX, "mindrecord": MINDRECORD_SUFFIX}
    if fmt not in suffixes:
        raise ValueError(f"unknown format {fmt!r}; expected one of {', '.join(FORMATS)}")
    return stem + suffixes[fmt]


def mindrecord_files_name(path: str, num_shards: int) -> str:
    """How messages name the data files of the MindRecord `path`: `x.mindrecord` itself for one shard,
    `x.mindrecord0..3` for four (no `x.mindrecord` exists then)."""
    return str(path) if num_shards == 1 else f"{path}0..{num_shards - 1}"


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


def format_of(path: str) -> str:
    """The format of an existing dataset path: "arrow" (a `save_to_disk` directory or an `.arrow`
    file), "mindrecord" (a `.mindrecord` / `.mindrecordN` file) or "mmap" (a prefix, `.bin` or `.idx`).

    Raises:
        ShardFormatError: the path is none of these.
    """
    path = str(path)
    if os.path.isdir(path):
        if os.path.isfile(os.path.join(path, ARROW_STATE_FILE)):
            return "arrow"
        raise ShardFormatError(f"{path}: a directory without {ARROW_STATE_FILE}, not a saved Arrow dataset")
    if path.endswith(".arrow"):
        return "arrow"
    if is_mindrecord_name(path):
        return "mindrecord"
    return "mmap"


def open_reader(path: str, fmt: str | None = None) -> Any:
    """Open a dataset of any format with its reader (`IndexedDataset` for mmap).

    Args:
        path: the dataset path (see `format_of`).
        fmt: one of `FORMATS`, or None to detect it from the path.
    """
    fmt = fmt or format_of(path)
    if fmt == "mmap":
        return IndexedDataset(path)
    if fmt == "arrow":
        from .arrow import ArrowReader

        return ArrowReader(path)
    if fmt == "mindrecord":
        from .mindrecord_reader import MindRecordReader

        return MindRecordReader(path)
    raise ValueError(f"unknown format {fmt!r}; expected one of {', '.join(FORMATS)}")


def open_writer(fmt: str, prefix_or_path: str, dtype: np.dtype | type, **options: Any) -> Any:
    """A streaming writer of format `fmt` (one of `FORMATS`); `options` go to its constructor.

    mmap: `IndexedDatasetWriter` (no options). arrow: `ArrowWriter` (`shard_size`, `store_sequence_lengths`,
    `field_types`). mindrecord: `MindRecordWriter` (`num_shards`, `header_size`, `page_size`,
    `empty_documents`, `store_sequence_lengths`, `field_types`).
    """
    if fmt == "mmap":
        if options:
            raise ValueError(f"the mmap writer takes no options, got {', '.join(sorted(options))}")
        return IndexedDatasetWriter(prefix_or_path, dtype)
    if fmt == "arrow":
        from .arrow import ArrowWriter

        return ArrowWriter(prefix_or_path, dtype, **options)
    if fmt == "mindrecord":
        from .mindrecord import MindRecordWriter

        return MindRecordWriter(prefix_or_path, dtype, **options)
    raise ValueError(f"unknown format {fmt!r}; expected one of {', '.join(FORMATS)}")


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
