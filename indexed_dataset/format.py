"""The Megatron "MMIDIDX" mmap token format, written out once.

A dataset is a pair of files sharing a prefix: `prefix.bin` holds every sequence's token ids back to
back (native little-endian, no header, no separators) and `prefix.idx` describes them:

    offset        size   content
    0             9      magic b"MMIDIDX\\x00\\x00"
    9             8      version, uint64 LE = 1
    17            1      dtype code, uint8 (`DType`)
    18            8      S = number of sequences, uint64 LE
    26            8      D = number of documents + 1, uint64 LE (length of document_indices)
    34            4*S    sequence_lengths, int32 LE (tokens per sequence)
    34+4S         8*S    sequence_pointers, int64 LE (byte offset of each sequence in .bin)
    34+12S        8*D    document_indices, int64 LE (0, then the running sequence count after each doc)

Nothing is aligned (34 is not a multiple of 8) and the total size is exactly 34 + 12*S + 8*D bytes.
A document is the sequences `[document_indices[d], document_indices[d + 1])`; a document that
produced no tokens repeats the previous value.
"""

from __future__ import annotations

import enum
import struct

import numpy as np

INDEX_MAGIC = b"MMIDIDX\x00\x00"
INDEX_VERSION = 1
# <9s magic, Q version, B dtype code, Q sequence count, Q document-index count>
INDEX_HEADER = struct.Struct("<9sQBQQ")
INDEX_HEADER_SIZE = INDEX_HEADER.size  # 34 bytes

SEQUENCE_LENGTH_DTYPE = np.dtype("<i4")
SEQUENCE_POINTER_DTYPE = np.dtype("<i8")
DOCUMENT_INDEX_DTYPE = np.dtype("<i8")

DATA_SUFFIX = ".bin"
INDEX_SUFFIX = ".idx"

# Megatron's `optimal_dtype` picks uint16 only below 65,500 (not 65,536); keeping its rule by default
# is what makes our files byte-identical to its tools' output.
MEGATRON_UINT16_VOCAB_LIMIT = 65500
UINT16_CARDINALITY = 2**16


class DType(enum.IntEnum):
    """On-disk dtype codes of the `.idx` header."""

    uint8 = 1
    int8 = 2
    int16 = 3
    int32 = 4
    int64 = 5
    float64 = 6
    float32 = 7
    uint16 = 8

    @classmethod
    def code_of(cls, dtype: np.dtype | type) -> "DType":
        """The code for a numpy dtype; ValueError if the format has none."""
        name = np.dtype(dtype).name
        try:
            return cls[name]
        except KeyError:
            raise ValueError(f"dtype {name} cannot be stored in an MMIDIDX index") from None

    def numpy(self) -> np.dtype:
        """The little-endian numpy dtype for this code."""
        return np.dtype(self.name).newbyteorder("<")


def optimal_dtype(vocab_size: int, rule: str = "megatron") -> np.dtype:
    """The token dtype for a vocabulary of `vocab_size` ids.

    Args:
        vocab_size: number of distinct token ids (the tokenizer's own size, not the padded one).
        rule: "megatron" (uint16 iff vocab_size < 65,500: byte-compatible with Megatron's tools) or
            "tight" (uint16 iff every id fits, vocab_size <= 65,536).
    """
    if vocab_size <= 0:
        raise ValueError(f"vocab_size must be positive, got {vocab_size}")
    if rule == "megatron":
        fits_uint16 = vocab_size < MEGATRON_UINT16_VOCAB_LIMIT
    elif rule == "tight":
        fits_uint16 = vocab_size <= UINT16_CARDINALITY
    else:
        raise ValueError(f"unknown dtype rule {rule!r}; expected 'megatron' or 'tight'")
    return np.dtype(np.uint16) if fits_uint16 else np.dtype(np.int32)


def data_file_path(prefix: str) -> str:
    """`prefix.bin`: the token data."""
    return str(prefix) + DATA_SUFFIX


def index_file_path(prefix: str) -> str:
    """`prefix.idx`: the index."""
    return str(prefix) + INDEX_SUFFIX


def strip_suffix(path: str) -> str:
    """The dataset prefix for a prefix, a `.bin` path or an `.idx` path."""
    path = str(path)
    for suffix in (DATA_SUFFIX, INDEX_SUFFIX):
        if path.endswith(suffix):
            return path[: -len(suffix)]
    return path


def index_file_size(num_sequences: int, num_document_indices: int) -> int:
    """Exact size in bytes of a (text, non-multimodal) `.idx` file."""
    return (
        INDEX_HEADER_SIZE
        + num_sequences * (SEQUENCE_LENGTH_DTYPE.itemsize + SEQUENCE_POINTER_DTYPE.itemsize)
        + num_document_indices * DOCUMENT_INDEX_DTYPE.itemsize
    )


def pack_index_header(dtype: np.dtype, num_sequences: int, num_document_indices: int) -> bytes:
    """The 34-byte `.idx` header."""
    return INDEX_HEADER.pack(
        INDEX_MAGIC, INDEX_VERSION, DType.code_of(dtype), num_sequences, num_document_indices
    )


def sequence_pointers(sequence_lengths: np.ndarray, itemsize: int) -> np.ndarray:
    """Byte offset of each sequence in `.bin`: an exclusive running sum in int64.

    Computed in int64 from the start: Megatron's old Python loop overflowed int32 past 2 GiB of
    tokens (NVIDIA/Megatron-LM#1519).

    Args:
        sequence_lengths: int [S], tokens per sequence.
        itemsize: bytes per token.

    Returns:
        int64 [S], first element 0.
    """
    pointers = np.zeros(len(sequence_lengths), dtype=SEQUENCE_POINTER_DTYPE)
    if len(sequence_lengths) > 1:
        np.cumsum(sequence_lengths[:-1], dtype=np.int64, out=pointers[1:])
        pointers *= itemsize
    return pointers
