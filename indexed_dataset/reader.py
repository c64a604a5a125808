"""Memory-mapped reader of Megatron `.bin/.idx` token files.

    ds = IndexedDataset("data/x_text_document")
    ds[0]                      # tokens of sequence 0, a zero-copy numpy view
    ds.get(5, offset=10, length=20)
    ds.validate()              # the full consistency check

Opening reads the 34-byte header, checks it and the two file sizes, maps both files (nothing is
copied) and checks every array against the others (`check_index_arrays`, vectorised: a few ms for a
100 MB corpus), so a damaged index is refused before anything is computed from it. `validate()`
runs the same check again.
"""

from __future__ import annotations

import mmap
import os
from typing import Union

import numpy as np

from .errors import IndexFormatError
from .format import (
    DOCUMENT_INDEX_DTYPE,
    INDEX_HEADER,
    INDEX_HEADER_SIZE,
    INDEX_MAGIC,
    INDEX_VERSION,
    SEQUENCE_LENGTH_DTYPE,
    SEQUENCE_POINTER_DTYPE,
    DType,
    data_file_path,
    index_file_path,
    index_file_size,
    sequence_pointers,
    strip_suffix,
)
from .protocol import DocumentBatch, SequenceCounts

# Sequences (and document indices) checked per vectorised step: about 50 MB of temporaries at most.
CHECK_BLOCK = 2**22


def _map_file(path: str) -> Union[mmap.mmap, bytes]:
    """A read-only map of the whole file (an empty bytes object for an empty file: mmap refuses those)."""
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            return b""
        return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)


class FileTokens:
    """The `.bin`'s tokens read with plain file reads, one read per slice (Megatron's ``_FileBinReader``, its
    ``--no-mmap-bin-files``): for file systems where memory maps are slow or unavailable. Sliced as the mapped
    token array is (step 1), giving a read-only array of the tokens read; nothing stays open between reads.

    Args:
        path: the `.bin` file.
        dtype: its token dtype.
        count: tokens in it.
    """

    def __init__(self, path: str, dtype: np.dtype, count: int) -> None:
        self.path, self.dtype, self.count = path, np.dtype(dtype), count

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: slice) -> np.ndarray:
        """Tokens ``[index.start, index.stop)`` (clipped to the file, as an array slice is)."""
        start, stop, step = index.indices(self.count)
        if step != 1:
            raise IndexError(f"{self.path}: slices with step {step} are not supported")
        length = max(stop - start, 0)
        with open(self.path, "rb") as f:
            f.seek(start * self.dtype.itemsize)
            data = f.read(length * self.dtype.itemsize)
        return np.frombuffer(data, self.dtype)


def check_index_arrays(
    idx_path: str,
    sequence_lengths: np.ndarray,
    pointers: np.ndarray,
    document_indices: np.ndarray,
    itemsize: int,
) -> None:
    """Check that the three `.idx` arrays describe one another, in vectorised blocks (bounded memory).

    Lengths must be >= 0, each pointer must be the byte sum of the lengths before it, and the document
    indices must run from 0 to S without going backwards. About 1 ms per million sequences.

    Args:
        idx_path: the `.idx` file, for messages.
        sequence_lengths: int32 [S], tokens per sequence.
        pointers: int64 [S], byte offset of each sequence in `.bin`.
        document_indices: int64 [D+1].
        itemsize: bytes per token.

    Raises:
        IndexFormatError: naming the file, the first bad entry and its byte offset in the file.
    """
    num_sequences = len(sequence_lengths)
    pointers_offset = INDEX_HEADER_SIZE + num_sequences * SEQUENCE_LENGTH_DTYPE.itemsize
    documents_offset = pointers_offset + num_sequences * SEQUENCE_POINTER_DTYPE.itemsize
    running_bytes = 0
    for start in range(0, num_sequences, CHECK_BLOCK):
        lengths = sequence_lengths[start : start + CHECK_BLOCK].astype(np.int64)
        negative = np.flatnonzero(lengths < 0)
        if negative.size:
            i = start + int(negative[0])
            raise IndexFormatError(
                f"{idx_path}: sequence {i} has negative length {sequence_lengths[i]} "
                f"(offset {INDEX_HEADER_SIZE + i * SEQUENCE_LENGTH_DTYPE.itemsize})"
            )
        expected = running_bytes + sequence_pointers(lengths, itemsize)
        wrong = np.flatnonzero(expected != pointers[start : start + CHECK_BLOCK])
        if wrong.size:
            i = start + int(wrong[0])
            raise IndexFormatError(
                f"{idx_path}: sequence {i} points to byte {pointers[i]} (offset "
                f"{pointers_offset + i * SEQUENCE_POINTER_DTYPE.itemsize}), but the lengths before it put it at "
                f"{expected[i - start]}"
            )
        running_bytes = int(expected[-1]) + int(lengths[-1]) * itemsize
    if document_indices[0] != 0 or document_indices[-1] != num_sequences:
        raise IndexFormatError(
            f"{idx_path}: document indices run from {document_indices[0]} to {document_indices[-1]}, "
            f"expected 0 to the sequence count {num_sequences}"
        )
    for start in range(0, len(document_indices) - 1, CHECK_BLOCK):
        backwards = np.flatnonzero(np.diff(document_indices[start : start + CHECK_BLOCK + 1]) < 0)
        if backwards.size:
            d = start + int(backwards[0]) + 1
            raise IndexFormatError(
                f"{idx_path}: document index {d} ({document_indices[d]}, offset "
                f"{documents_offset + d * DOCUMENT_INDEX_DTYPE.itemsize}) is below the one before it"
            )


class IndexedDataset(SequenceCounts):
    """A read-only, memory-mapped view of one `.bin/.idx` pair.

    Args:
        path: the dataset prefix (`data/x_text_document`), or its `.bin` or `.idx` path.
        mmap_bin: map the `.bin` (True); False: read its tokens with plain file reads (`FileTokens`: ``tokens``
            is then sliceable, not an array). The `.idx` is mapped either way, as in Megatron.

    Raises:
        IndexFormatError: a file is missing, or the header, a file size or an array is wrong (names the
            file, and the offset where known).
    """

    def __init__(self, path: str, mmap_bin: bool = True) -> None:
        self.prefix = strip_suffix(path)
        self.idx_path = index_file_path(self.prefix)
        self.bin_path = data_file_path(self.prefix)
        for file_path in (self.idx_path, self.bin_path):
            if not os.path.isfile(file_path):
                raise IndexFormatError(f"{file_path}: no such file")

        idx_size = os.path.getsize(self.idx_path)
        if idx_size < INDEX_HEADER_SIZE:
            raise IndexFormatError(
                f"{self.idx_path}: truncated: {idx_size} bytes, shorter than the {INDEX_HEADER_SIZE}-byte header"
            )
        with open(self.idx_path, "rb") as f:
            magic, version, code, num_sequences, num_document_indices = INDEX_HEADER.unpack(
                f.read(INDEX_HEADER_SIZE)
            )
        if magic != INDEX_MAGIC:
            raise IndexFormatError(f"{self.idx_path}: not an MMIDIDX index (magic {magic!r} at offset 0)")
        if version != INDEX_VERSION:
            raise IndexFormatError(f"{self.idx_path}: unsupported version {version} at offset 9 (expected 1)")
        try:
            self.dtype = DType(code).numpy()
        except ValueError:
            raise IndexFormatError(f"{self.idx_path}: unknown dtype code {code} at offset 17") from None
        if num_document_indices < 1:
            raise IndexFormatError(f"{self.idx_path}: document index count is 0 at offset 26 (must be >= 1)")
        expected_size = index_file_size(num_sequences, num_document_indices)
        if idx_size != expected_size:
            raise IndexFormatError(
                f"{self.idx_path}: {idx_size} bytes, but the header ({num_sequences} sequences, "
                f"{num_document_indices} document indices) needs exactly {expected_size}"
            )

        self._idx_map = _map_file(self.idx_path)
        offset = INDEX_HEADER_SIZE
        self.sequence_lengths = np.frombuffer(
            self._idx_map, SEQUENCE_LENGTH_DTYPE, num_sequences, offset
        )
        offset += self.sequence_lengths.nbytes
        self.sequence_pointers = np.frombuffer(
            self._idx_map, SEQUENCE_POINTER_DTYPE, num_sequences, offset
        )
        offset += self.sequence_pointers.nbytes
        self.document_indices = np.frombuffer(
            self._idx_map, DOCUMENT_INDEX_DTYPE, num_document_indices, offset
        )
        # Every array is checked before anything is computed from it: a damaged index must be one
        # clear error here, never an IndexError (or a wrong statistic) later.
        check_index_arrays(
            self.idx_path, self.sequence_lengths, self.sequence_pointers, self.document_indices, self.dtype.itemsize
        )
        bin_size = os.path.getsize(self.bin_path)
        expected_bin = self._expected_bin_size()
        if bin_size != expected_bin:
            raise IndexFormatError(
                f"{self.bin_path}: {bin_size} bytes, but the index says {expected_bin}"
                + (" (truncated)" if bin_size < expected_bin else "")
            )
        if mmap_bin:
            self._bin_map = _map_file(self.bin_path)
            self.tokens = np.frombuffer(self._bin_map, self.dtype, bin_size // self.dtype.itemsize)
        else:
            self.tokens = FileTokens(self.bin_path, self.dtype, bin_size // self.dtype.itemsize)

    @property
    def num_tokens(self) -> int:
        """Total number of tokens in `.bin`."""
        return len(self.tokens)

    def __getitem__(self, index: Union[int, slice]) -> Union[np.ndarray, list[np.ndarray]]:
        """Sequence `index` as a zero-copy view, or a list of views for a step-1 slice."""
        if isinstance(index, slice):
            start, stop, step = index.indices(self.num_sequences)
            if step != 1:
                raise IndexError(f"{self.prefix}: slices with step {step} are not supported")
            return [self.get(i) for i in range(start, stop)]
        return self.get(int(index))

    def get(self, index: int, offset: int = 0, length: int | None = None) -> np.ndarray:
        """Tokens `[offset, offset + length)` of sequence `index` (to its end when length is None).

        Raises:
            IndexError: the sequence or the token range is out of bounds.
        """
        if index < 0:
            index += self.num_sequences
        if not 0 <= index < self.num_sequences:
            raise IndexError(f"{self.prefix}: sequence {index} out of range [0, {self.num_sequences})")
        sequence_length = int(self.sequence_lengths[index])
        if length is None:
            length = sequence_length - offset
        if offset < 0 or length < 0 or offset + length > sequence_length:
            raise IndexError(
                f"{self.prefix}: tokens [{offset}, {offset + length}) outside sequence {index} "
                f"of length {sequence_length}"
            )
        start = int(self.sequence_pointers[index]) // self.dtype.itemsize + offset
        view = self.tokens[start : start + length]
        if len(view) != length:
            # Only a damaged index points past the data; never hand back a short read as if it were whole.
            raise IndexFormatError(
                f"{self.idx_path}: sequence {index} points past the end of {self.bin_path}; run validate()"
            )
        return view

    def document(self, index: int) -> np.ndarray:
        """All tokens of document `index` (its sequences are contiguous in `.bin`)."""
        if not 0 <= index < self.num_documents:
            raise IndexError(f"{self.prefix}: document {index} out of range [0, {self.num_documents})")
        return self.read_documents(index, index + 1).tokens

    def read_documents(self, first: int, last: int) -> DocumentBatch:
        """Documents `[first, last)` in the writers' flat layout (token views, no copy)."""
        first_sequence, last_sequence = int(self.document_indices[first]), int(self.document_indices[last])
        lengths = self.sequence_lengths[first_sequence:last_sequence].astype(np.int64)
        start = int(self.sequence_pointers[first_sequence]) // self.dtype.itemsize if lengths.size else 0
        return DocumentBatch(
            self.tokens[start : start + int(lengths.sum())], lengths, np.diff(self.document_indices[first : last + 1])
        )

    def _expected_bin_size(self) -> int:
        """Bytes `.bin` must hold: the last sequence's pointer plus its length (arrays already checked)."""
        if not self.num_sequences:
            return 0
        return int(self.sequence_pointers[-1]) + int(self.sequence_lengths[-1]) * self.dtype.itemsize

    def validate(self) -> None:
        """The full consistency check of every array and of the `.bin` size (opening runs it too; this
        re-checks files that may have changed since).

        Raises:
            IndexFormatError: naming the file and the first problem found.
        """
        check_index_arrays(
            self.idx_path, self.sequence_lengths, self.sequence_pointers, self.document_indices, self.dtype.itemsize
        )
        bin_size = os.path.getsize(self.bin_path)
        if bin_size != self._expected_bin_size():
            raise IndexFormatError(f"{self.bin_path}: {bin_size} bytes, but the lengths add up to "
                                   f"{self._expected_bin_size()}")

    def __getstate__(self) -> dict:
        # Maps cannot be pickled; a copy sent to a DataLoader worker (spawn) reopens the files by name.
        return {"prefix": self.prefix}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["prefix"])

    def __repr__(self) -> str:
        return (
            f"IndexedDataset({self.prefix!r}, dtype={self.dtype.name}, sequences={self.num_sequences}, "
            f"documents={self.num_documents}, tokens={self.num_tokens})"
        )
