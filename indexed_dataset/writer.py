"""Streaming writer of Megatron `.bin/.idx` token files.

    with IndexedDatasetWriter("out/x_text_document", np.uint16) as writer:
        writer.add_document(ids, lengths=[len(ids)])
    # both files now exist; had the block raised, neither would.

Memory grows with the number of sequences (4 + 8 bytes each, in growable numpy buffers), never with
the number of tokens: tokens go straight to a temporary `.bin`. Pointers are computed once, in int64,
at `finalize()`, which then renames the temporaries into place (`.bin` first, `.idx` last, after
removing any old `.idx`), so an interrupted run never leaves a pair that looks complete.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Sequence

import numpy as np

from .errors import TokenmillError, TokenRangeError
from .format import (
    DOCUMENT_INDEX_DTYPE,
    SEQUENCE_LENGTH_DTYPE,
    DType,
    data_file_path,
    index_file_path,
    pack_index_header,
    sequence_pointers,
)
from .permissions import give_default_permissions
from .protocol import TokenWriter
from .reader import IndexedDataset

# Large buffered writes: the .bin stream is the only place tokens pass through.
BIN_WRITE_BUFFER_BYTES = 8 * 2**20
_INITIAL_CAPACITY = 1024
_INT32_MAX = np.iinfo(np.int32).max


class _GrowableArray:
    """An append-only numpy array that doubles its capacity (amortised O(1) appends, no Python lists)."""

    def __init__(self, dtype: np.dtype, first: Sequence[int] = ()) -> None:
        self._data = np.empty(max(_INITIAL_CAPACITY, len(first)), dtype=dtype)
        self._size = 0
        self.extend(np.asarray(first, dtype=dtype))

    def extend(self, values: np.ndarray) -> None:
        needed = self._size + len(values)
        if needed > len(self._data):
            grown = np.empty(max(needed, 2 * len(self._data)), dtype=self._data.dtype)
            grown[: self._size] = self._data[: self._size]
            self._data = grown
        self._data[self._size : needed] = values
        self._size = needed

    def view(self) -> np.ndarray:
        return self._data[: self._size]

    def __len__(self) -> int:
        return self._size

    def last(self) -> int:
        return int(self._data[self._size - 1])


def _temporary_path(final_path: str) -> str:
    """A fresh hidden temporary file beside `final_path`, with the permissions a plain open() would give."""
    directory, name = os.path.split(os.path.abspath(final_path))
    handle, path = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=directory)
    os.close(handle)
    give_default_permissions(path)  # mkstemp creates 0600
    return path


class IndexedDatasetWriter(TokenWriter):
    """Writes one `.bin/.idx` pair, streaming tokens to disk.

    Args:
        prefix: output prefix; the files are `prefix.bin` and `prefix.idx`.
        dtype: token dtype (see `optimal_dtype`); every id is range-checked against it.

    Raises:
        TokenRangeError: from the add methods, when an id does not fit `dtype`.
    """

    def __init__(self, prefix: str, dtype: np.dtype | type) -> None:
        self.prefix = str(prefix)
        self.path = self.prefix
        self.dtype = np.dtype(dtype).newbyteorder("<")
        DType.code_of(self.dtype)  # fail now, not at finalize, for a dtype the format cannot hold
        self._limits = np.iinfo(self.dtype) if self.dtype.kind in "iu" else None
        directory = os.path.dirname(os.path.abspath(self.prefix))
        if not os.path.isdir(directory):
            raise TokenmillError(f"{self.prefix}: output directory {directory} does not exist")
        self._bin_tmp = _temporary_path(data_file_path(self.prefix))
        self._bin = open(self._bin_tmp, "wb", buffering=BIN_WRITE_BUFFER_BYTES)
        self._lengths = _GrowableArray(SEQUENCE_LENGTH_DTYPE)
        self._document_indices = _GrowableArray(DOCUMENT_INDEX_DTYPE, [0])
        self._idx_tmp: str | None = None

    # ----------------------------------------------------------------------------------------- adding
    @property
    def num_documents(self) -> int:
        """Documents closed so far."""
        return len(self._document_indices) - 1

    @property
    def num_sequences(self) -> int:
        """Sequences written so far."""
        return len(self._lengths)

    def _write_tokens(self, tokens: np.ndarray, sequence_lengths: np.ndarray) -> None:
        tokens = np.asarray(tokens)
        if tokens.ndim != 1:
            raise ValueError(f"tokens must be one-dimensional, got shape {tokens.shape}")
        if tokens.size and tokens.dtype.kind not in "iu" and self._limits is not None:
            raise ValueError(f"token ids must be integers, got dtype {tokens.dtype}")
        if tokens.size and self._limits is not None and tokens.dtype != self.dtype:
            low, high = tokens.min(), tokens.max()
            if low < self._limits.min or high > self._limits.max:
                bad = int(np.flatnonzero((tokens < self._limits.min) | (tokens > self._limits.max))[0])
                sequence = int(np.searchsorted(np.cumsum(sequence_lengths), bad, side="right"))
                raise TokenRangeError(
                    f"{self.prefix}: token id {tokens[bad]} in sequence {self.num_sequences + sequence} does "
                    f"not fit {self.dtype.name} (range {self._limits.min}..{self._limits.max})"
                )
        if sequence_lengths.size and (sequence_lengths.min() < 0 or sequence_lengths.max() > _INT32_MAX):
            raise ValueError(f"{self.prefix}: sequence lengths must lie in [0, {_INT32_MAX}]")
        self._bin.write(memoryview(np.ascontiguousarray(tokens, dtype=self.dtype)))
        self._lengths.extend(sequence_lengths)

    def add_item(self, ids: np.ndarray | Sequence[int]) -> None:
        """Append one sequence to the open document."""
        ids = np.asarray(ids)
        self._write_tokens(ids, np.array([len(ids)], dtype=np.int64))

    def end_document(self) -> None:
        """Close the open document (with no sequences added since the last close, an empty document)."""
        self._document_indices.extend(np.array([self.num_sequences], dtype=DOCUMENT_INDEX_DTYPE))

    def add_documents(
        self, tokens: np.ndarray, sequence_lengths: np.ndarray, document_sequence_counts: np.ndarray
    ) -> None:
        """Append many documents at once: the vectorised path of the preprocessing pipeline.

        Args:
            tokens: [N] ids of every sequence, concatenated.
            sequence_lengths: [S] tokens per sequence, summing to N.
            document_sequence_counts: [D] sequences per document, summing to S (0 = an empty document).
        """
        sequence_lengths = np.asarray(sequence_lengths, dtype=np.int64)
        counts = np.asarray(document_sequence_counts, dtype=np.int64)
        if int(sequence_lengths.sum()) != len(tokens):
            raise ValueError(f"sequence lengths add up to {int(sequence_lengths.sum())}, not {len(tokens)} tokens")
        if int(counts.sum()) != len(sequence_lengths) or (counts.size and counts.min() < 0):
            raise ValueError(f"document sequence counts must be >= 0 and add up to {len(sequence_lengths)}")
        first_sequence = self.num_sequences
        self._write_tokens(tokens, sequence_lengths)
        self._document_indices.extend(first_sequence + np.cumsum(counts, dtype=np.int64))

    def add_index(self, prefix: str) -> None:
        """Append a whole existing dataset (same dtype), copying its `.bin` bytes verbatim.

        Raises:
            TokenmillError: the dtypes differ.
        """
        source = IndexedDataset(prefix)
        if source.dtype != self.dtype:
            raise TokenmillError(
                f"{source.idx_path}: dtype {source.dtype.name} differs from the output's {self.dtype.name}"
            )
        first_sequence = self.num_sequences
        self._lengths.extend(source.sequence_lengths)
        self._document_indices.extend(source.document_indices[1:] + first_sequence)
        self._bin.flush()
        with open(source.bin_path, "rb") as f:
            shutil.copyfileobj(f, self._bin, BIN_WRITE_BUFFER_BYTES)

    # ------------------------------------------------------------------------------------- finishing
    def _finish(self) -> None:
        """Write the index and move both files into place, closing an open document first."""
        if self._document_indices.last() != self.num_sequences:
            self.end_document()
        self._bin.close()
        lengths = self._lengths.view()
        self._idx_tmp = _temporary_path(index_file_path(self.prefix))
        with open(self._idx_tmp, "wb") as f:
            f.write(pack_index_header(self.dtype, len(lengths), len(self._document_indices)))
            f.write(memoryview(lengths))
            f.write(memoryview(sequence_pointers(lengths, self.dtype.itemsize)))
            f.write(memoryview(self._document_indices.view()))
        # The .idx appears last: until it does, no reader takes the pair for complete.
        if os.path.exists(index_file_path(self.prefix)):
            os.remove(index_file_path(self.prefix))
        os.replace(self._bin_tmp, data_file_path(self.prefix))
        os.replace(self._idx_tmp, index_file_path(self.prefix))

    def _discard(self) -> None:
        # Closing flushes the buffer, which fails again on a full disk: the temporaries go regardless.
        with contextlib.suppress(OSError):
            self._bin.close()
        for temporary in (self._bin_tmp, self._idx_tmp):
            if temporary and os.path.exists(temporary):
                os.remove(temporary)
