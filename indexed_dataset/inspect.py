"""What is inside a token dataset: header, counts, length statistics, max token id, decoded text.

    from indexed_dataset.inspect import inspect_dataset
    report = inspect_dataset("out/corpus_text_document")   # or the .bin/.idx path
    report.tokens, report.max_token_id, report.sequence_lengths.p99
    inspect_dataset("out/corpus_text_document_arrow")      # Arrow (save_to_disk) and MindRecord too

Every format is opened through `open_reader`, so the same facts come out of each. Decoding takes any object
with `vocab_size` and `decode(ids) -> str` (`TokenDecoder`; the tokenizers are `preprocess.tokenizers`).
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from typing import Protocol

import numpy as np

from .errors import TokenmillError
from .format import INDEX_VERSION
from .formats import files_read, format_of, open_reader
from .mindrecord_reader import read_header
from .protocol import DocumentBatch

P99 = 99
# Row formats are scanned for their max id and validated in blocks of this many documents (bounded memory).
SCAN_DOCUMENTS = 65536


class TokenDecoder(Protocol):
    """What decoding and the vocabulary check need of a tokenizer."""

    vocab_size: int

    def decode(self, ids: list[int]) -> str: ...


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
    format: str
    version: str
    dtype: str
    sequences: int
    documents: int
    empty_documents: int
    tokens: int
    sequence_lengths: LengthStats
    document_lengths: LengthStats
    max_token_id: int
    files: dict[str, int]
    """Bytes of each file the dataset is made of."""

    def as_dict(self) -> dict:
        return asdict(self)


def format_version(fmt: str, dataset) -> str:
    """The on-disk version: the MMIDIDX index version, or the MindRecord header's."""
    if fmt == "mmap":
        return str(INDEX_VERSION)
    if fmt == "mindrecord":
        return str(read_header(dataset.paths[0])["version"])
    return "save_to_disk"


def scan_tokens(dataset) -> int:
    """The largest token id (-1 for no tokens), reading every document once in bounded blocks (for the
    row formats this also decodes, and so checks, every row)."""
    largest = -1
    for first in range(0, dataset.num_documents, SCAN_DOCUMENTS):
        tokens = dataset.read_documents(first, min(first + SCAN_DOCUMENTS, dataset.num_documents)).tokens
        if len(tokens):
            largest = max(largest, int(tokens.max()))
    return largest


def document_token_counts(dataset) -> np.ndarray:
    """int64 [D], tokens per document (sum of its sequences' lengths)."""
    cumulative = np.zeros(dataset.num_sequences + 1, dtype=np.int64)
    np.cumsum(dataset.sequence_lengths, out=cumulative[1:])
    return np.diff(cumulative[dataset.document_indices])


def inspect_dataset(path: str) -> DatasetReport:
    """Read a dataset's header and arrays and summarise them (one pass over the tokens for the max id).

    Args:
        path: an mmap prefix (or its `.bin`/`.idx`), an Arrow `save_to_disk` folder or `.arrow` file, or a
            MindRecord file.

    Raises:
        TokenmillError: a file is missing or damaged (IndexFormatError, ShardFormatError): the readers
            check the structure on open, before any statistic is computed from it.
    """
    fmt = format_of(path)
    dataset = open_reader(path, fmt)
    documents = document_token_counts(dataset)
    return DatasetReport(
        prefix=getattr(dataset, "prefix", path),
        format=fmt,
        version=format_version(fmt, dataset),
        dtype=dataset.dtype.name,
        sequences=dataset.num_sequences,
        documents=dataset.num_documents,
        empty_documents=int(np.count_nonzero(documents == 0)),
        tokens=int(dataset.num_tokens),
        sequence_lengths=LengthStats.of(dataset.sequence_lengths),
        document_lengths=LengthStats.of(documents),
        max_token_id=scan_tokens(dataset),
        files={file: os.path.getsize(file) for file in files_read(fmt, dataset)},
    )


def validate_dataset(path: str, tokenizer: TokenDecoder | None = None) -> None:
    """The full consistency check, plus (with a tokenizer) every id below its vocab_size.

    Raises:
        IndexFormatError: the files are damaged or inconsistent.
        TokenmillError: a token id is outside the tokenizer's vocabulary.
    """
    dataset = open_reader(path)
    # mmap: every array and both file sizes; row formats: every row decoded (framing, sizes, id range).
    dataset.validate()
    if tokenizer is not None:
        for first in range(0, dataset.num_documents, SCAN_DOCUMENTS):
            last = min(first + SCAN_DOCUMENTS, dataset.num_documents)
            check_vocabulary(path, dataset.read_documents(first, last), first, tokenizer.vocab_size)


def check_vocabulary(path: str, batch: DocumentBatch, first_document: int, vocab_size: int) -> None:
    """Refuse ids outside `[0, vocab_size)`: a tokenizer would decode them wrongly or panic (gigatoken).

    Args:
        path: the dataset, for messages.
        batch: consecutive documents, the first being document `first_document`.
        vocab_size: the tokenizer's vocabulary size.

    Raises:
        TokenmillError: naming the document and the id.
    """
    tokens = batch.tokens
    if not tokens.size or (tokens.min() >= 0 and tokens.max() < vocab_size):
        return
    bad = int(np.flatnonzero((tokens < 0) | (tokens >= vocab_size))[0])
    document = first_document + int(np.searchsorted(batch.document_token_offsets(), bad, side="right")) - 1
    raise TokenmillError(f"{path}: token id {tokens[bad]} in document {document} is outside the tokenizer's "
                         f"vocabulary [0, {vocab_size})")


def decode_documents(path: str, tokenizer: TokenDecoder, indices: list[int]) -> dict[int, str]:
    """The text of each listed document (its ids checked against the vocabulary first).

    Raises:
        TokenmillError: a document index is out of range, or a document holds an id outside the vocabulary.
    """
    dataset = open_reader(path)
    for index in indices:
        if not 0 <= index < dataset.num_documents:
            raise TokenmillError(f"{path}: document {index} out of range [0, {dataset.num_documents})")
    decoded = {}
    for index in indices:
        batch = dataset.read_documents(index, index + 1)
        check_vocabulary(path, batch, index, tokenizer.vocab_size)
        ends = np.cumsum(batch.sequence_lengths)
        sentences = [tokenizer.decode(ids) for ids in np.split(batch.tokens, ends[:-1])] if len(ends) else [""]
        decoded[index] = join_sentences(sentences)
    return decoded


def join_sentences(sentences: list[str]) -> str:
    """A sentence-split document's text: its sentences with one space between two that meet without any.

    Sentence splitting (Megatron's, and ours by default) drops the whitespace between sentences and each
    sentence is tokenized on its own, so a byte-level BPE's ids hold no space there; SentencePiece and
    WordPiece decoders add none either. A document of one sequence is its decoded text unchanged.
    """
    text = sentences[0] if sentences else ""
    for sentence in sentences[1:]:
        if text and sentence and not text[-1].isspace() and not sentence[0].isspace():
            text += " "
        text += sentence
    return text
