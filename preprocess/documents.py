"""From parsed texts to Megatron documents: tokenize, drop empty sequences, append EOD, vectorised.

Megatron's per-document rules (tools/preprocess_data.py), applied to a whole batch with numpy:
  * each piece (a sentence, or the whole text) is one sequence; pieces with no tokens are dropped;
  * a document whose pieces all tokenize to nothing is an empty document (no sequences, no EOD);
  * `--append-eod` appends the eod id to a non-empty document, counted in its last sequence.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from .chunks import ParsedChunk, TextColumn
from .columnar import RecordBatchChunk
from .errors import EncodeError, InputError
from .jsonl import JsonLinesChunk
from .sentences import SentenceSplitter
from .tokenizers import Tokenizer

# Ids leave the encoder as uint16 wherever they all fit (GPT-2's, BERT's vocabularies): half the bytes
# to move between processes, and the writers, whose dtype is then the same, neither cast nor range-check
# them again (gigatoken gives uint32, the other tokenizers int64).
COMPACT_DTYPE = np.dtype(np.uint16)


@dataclass(frozen=True)
class EncodedColumn:
    """One key's documents in the writers' layout (see IndexedDatasetWriter.add_documents).

    Attributes:
        tokens: [N] ids, concatenated.
        sequence_lengths: int64 [S], tokens per sequence.
        document_sequence_counts: int64 [D], sequences per document (0 = empty document).
    """

    tokens: np.ndarray
    sequence_lengths: np.ndarray
    document_sequence_counts: np.ndarray

    @property
    def num_empty_documents(self) -> int:
        return int(np.count_nonzero(self.document_sequence_counts == 0))


def compact_dtype(tokens: np.ndarray, eod: int | None) -> np.dtype:
    """COMPACT_DTYPE when every id of `tokens` (an integer array) and `eod` fit it, else `tokens`' dtype."""
    if tokens.dtype.itemsize <= COMPACT_DTYPE.itemsize:
        return tokens.dtype
    limits = np.iinfo(COMPACT_DTYPE)
    fits = eod is None or limits.min <= eod <= limits.max
    if fits and tokens.size:
        fits = int(tokens.max()) <= limits.max and (tokens.dtype.kind == "u" or int(tokens.min()) >= limits.min)
    return COMPACT_DTYPE if fits else tokens.dtype


def _insert_eods(tokens: np.ndarray, token_ends: np.ndarray, eod: int, dtype: np.dtype) -> np.ndarray:
    """`tokens` with `eod` inserted before each index of `token_ends` (ascending), as `dtype` (whose range
    every id must fit): one pass, the cast done by the same copy (np.insert, then a cast, takes two)."""
    positions = token_ends + np.arange(len(token_ends))
    inserted = np.empty(len(tokens) + len(positions), dtype=dtype)
    is_token = np.ones(len(inserted), dtype=bool)
    is_token[positions] = False
    inserted[is_token] = tokens
    inserted[positions] = eod
    return inserted


def assemble_documents(
    tokens: np.ndarray,
    piece_lengths: np.ndarray,
    piece_counts: np.ndarray | None,
    eod: int | None,
    dtype: np.dtype | None = None,
) -> EncodedColumn:
    """Megatron documents from tokenized pieces.

    Args:
        tokens: [N] ids of every piece, concatenated.
        piece_lengths: int64 [P] tokens per piece.
        piece_counts: int64 [D] pieces per document, or None for one piece per document.
        eod: id appended to every non-empty document, or None.
        dtype: the dtype of the documents' ids (default: `tokens`'); every id and `eod` must fit it
            (see `compact_dtype`).

    Returns:
        the documents, with empty pieces dropped and EOD appended.
    """
    dtype = tokens.dtype if dtype is None else np.dtype(dtype)
    keep = piece_lengths > 0
    sequence_lengths = piece_lengths[keep].astype(np.int64)
    if piece_counts is None:
        counts = keep.astype(np.int64)
    else:
        kept_before = np.zeros(len(keep) + 1, dtype=np.int64)
        np.cumsum(keep, out=kept_before[1:])
        bounds = np.zeros(len(piece_counts) + 1, dtype=np.int64)
        np.cumsum(piece_counts, out=bounds[1:])
        counts = kept_before[bounds[1:]] - kept_before[bounds[:-1]]
    if eod is None or not len(sequence_lengths):
        return EncodedColumn(tokens.astype(dtype, copy=False), sequence_lengths, counts)
    last_sequence = np.cumsum(counts)[counts > 0] - 1
    token_ends = np.cumsum(sequence_lengths)[last_sequence]
    tokens = _insert_eods(tokens, token_ends, eod, dtype)
    sequence_lengths[last_sequence] += 1
    return EncodedColumn(tokens, sequence_lengths, counts)


def split_column(column: TextColumn, splitter: SentenceSplitter) -> TextColumn:
    """Every piece cut into sentences (an already-split list's strings are split further if needed)."""
    sentences, per_piece = [], []
    for text in column.pieces.to_pylist():
        parts = splitter.split(text)
        sentences.extend(parts)
        per_piece.append(len(parts))
    per_piece = np.array(per_piece, dtype=np.int64)
    if column.piece_counts is None:
        counts = per_piece
    else:
        bounds = np.zeros(len(column.piece_counts) + 1, dtype=np.int64)
        np.cumsum(column.piece_counts, out=bounds[1:])
        per_piece_before = np.zeros(len(per_piece) + 1, dtype=np.int64)
        np.cumsum(per_piece, out=per_piece_before[1:])
        counts = per_piece_before[bounds[1:]] - per_piece_before[bounds[:-1]]
    return TextColumn(pa.array(sentences, type=pa.large_string()), counts)


@dataclass(frozen=True)
class EncodeSettings:
    """What a worker needs to turn a chunk into documents (picklable: it crosses process boundaries)."""

    keys: tuple[str, ...]
    eod: int | None
    skip_invalid: bool = False
    lang: str | None = None
    """Split sentences in this language; None = no splitting."""
    keep_newlines: bool = False
    fields: tuple[str, ...] = ()
    """Scalar fields passed through to the row formats (Arrow)."""


@dataclass
class EncodedChunk:
    """A chunk's documents, per key, ready for the writers (`fields`: kept values, name -> [D])."""

    source: str
    num_bytes: int
    num_documents: int
    columns: dict[str, EncodedColumn]
    skipped: list[tuple[int, str]] = field(default_factory=list)
    fields: dict[str, pa.Array] = field(default_factory=dict)
    first_line: int = 0
    """Line (row, for columnar inputs) of the chunk's first document, for messages."""


def _line_of_piece(parsed: ParsedChunk, column: TextColumn, piece: int) -> int:
    if column.piece_counts is None:
        return int(parsed.line_numbers[piece])
    document = int(np.searchsorted(np.cumsum(column.piece_counts), piece, side="right"))
    return int(parsed.line_numbers[document])


def encode_chunk(
    chunk: JsonLinesChunk | RecordBatchChunk, tokenizer: Tokenizer, settings: EncodeSettings
) -> EncodedChunk:
    """Parse, split (optionally) and tokenize one chunk (any chunk kind with a `parse` method).

    Raises:
        InputError: an invalid line (unless skipping) or a text the tokenizer rejects, as `file:line:`.
    """
    parsed = chunk.parse(settings.keys, settings.skip_invalid, settings.fields)
    splitter = SentenceSplitter(settings.lang, settings.keep_newlines) if settings.lang else None
    columns = {}
    for key, column in parsed.columns.items():
        if splitter is not None:
            column = split_column(column, splitter)
        try:
            ragged = tokenizer.encode_batch(column.pieces)
        except EncodeError as error:
            line = _line_of_piece(parsed, column, error.index)
            raise InputError(f"{chunk.location(line)}: key {key!r}: {error.reason}") from None
        columns[key] = assemble_documents(ragged.tokens, ragged.lengths, column.piece_counts, settings.eod,
                                          compact_dtype(ragged.tokens, settings.eod))
    first_line = int(parsed.line_numbers[0]) if parsed.num_documents else 0
    return EncodedChunk(chunk.source, chunk.num_bytes, parsed.num_documents, columns, parsed.skipped,
                        parsed.fields, first_line)
