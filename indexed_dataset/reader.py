"""Memory-mapped reader of Megatron `.bin/.idx` token files.

    ds = IndexedDataset("data/x_text_document")
    ds[0]                      # tokens of sequence 0, a zero-copy numpy view
    ds.get(5, offset=10, length=20)
    ds.validate()              # the full consistency check

Opening reads the 34-byte header, checks it and the two file sizes in O(1), and maps both files;
nothing is copied. `validate()` walks every array once.
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


def _map_file(path: str) -> Union[mmap.mmap, bytes]:
    """A read-only map of the whole file (an empty bytes object for an empty file: mmap refuses those)."""
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            return b""
        return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)


class IndexedDataset(SequenceCounts):
    """A read-only, memory-mapped view of one `.bin/.idx` pair.

    Args:
        path: the dataset prefix (`data/x_text_document`), or its `.bin` or `.idx` path.

    Raises:
        IndexFormatError: a file is missing, or the header or a file size is wrong.
    """

    def __init__(self, path: str) -> None:
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
        if self.document_indices[0] != 0 or self.document_indices[-1] != num_sequences:
            raise IndexFormatError(
                f"{self.idx_path}: document indices run from {self.document_indices[0]} to "
                f"{self.document_indices[-1]}, expected 0 to the sequence count {num_sequences}"
            )

        bin_size = os.path.getsize(self.bin_path)
        if num_sequences:
            last_length = int(self.sequence_lengths[-1])
            expected_bin = int(self.sequence_pointers[-1]) + last_length * self.dtype.itemsize
            if last_length < 0 or expected_bin < 0:
                raise IndexFormatError(f"{self.idx_path}: negative length or pointer for the last sequence")
        else:
            expected_bin = 0
        if bin_size != expected_bin:
            raise IndexFormatError(
                f"{self.bin_path}: {bin_size} bytes, but the index says {expected_bin}"
                + (" (truncated)" if bin_size < expected_bin else "")
            )
        self._bin_map = _map_file(self.bin_path)
        self.tokens = np.frombuffer(self._bin_map, self.dtype, bin_size // self.dtype.itemsize)

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

    def validate(self) -> None:
        """The full consistency check of every array.

        Raises:
            IndexFormatError: naming the file and the first problem found.
        """
        lengths = self.sequence_lengths
        negative = np.flatnonzero(lengths < 0)
        if negative.size:
            raise IndexFormatError(f"{self.idx_path}: sequence {negative[0]} has negative length {lengths[negative[0]]}")
        expected = sequence_pointers(lengths, self.dtype.itemsize)
        wrong = np.flatnonzero(expected != self.sequence_pointers)
        if wrong.size:
            i = wrong[0]
            raise IndexFormatError(
                f"{self.idx_path}: sequence {i} points to byte {self.sequence_pointers[i]}, "
                f"but the lengths before it put it at {expected[i]}"
            )
        steps = np.diff(self.document_indices)
        backwards = np.flatnonzero(steps < 0)
        if backwards.size:
            d = backwards[0] + 1
            raise IndexFormatError(
                f"{self.idx_path}: document index {d} ({self.document_indices[d]}) is below the one before it"
            )
        total_bytes = int(lengths.sum(dtype=np.int64)) * self.dtype.itemsize
        bin_size = os.path.getsize(self.bin_path)
        if bin_size != total_bytes:
            raise IndexFormatError(f"{self.bin_path}: {bin_size} bytes, but the lengths add up to {total_bytes}")

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
