"""MindSpore's "CompressInt" encoding of integer arrays: numba kernels and their numpy reference twins.

One encoded array (a MindRecord blob field) is

    [u32 BE element count n][bitmap: (n + 3) // 4 bytes][every value little-endian in its width]

The bitmap holds a 2-bit width code per value (0 int8, 1 int16, 2 int32, 3 int64), four codes a
byte, the first code in the most significant bits; the last byte is filled up with code 0. A value
gets the narrowest signed width that holds it.

    sizes = compress_int_sizes(values, counts)              # bytes of each row's encoding
    compress_int_into(values, counts, out, starts, sizes)   # write row r at out[starts[r]:]
    encoded, sizes = compress_int_rows(values, counts)      # the rows back to back
    values, counts = decompress_int_rows(encoded, np.cumsum(sizes) - sizes, sizes)

Rows are given the writers' way: the values of all rows concatenated, and the elements per row.
The `*_reference` functions compute the same with whole-array numpy operations; the tests hold the
kernels to them.
"""

from __future__ import annotations

import numba
import numpy as np

from .errors import ShardFormatError

COUNT_BYTES = 4  # the u32 BE element count in front of every row
MAX_COUNT = 2**32 - 1
CODES_PER_BYTE = 4
CODE_BITS = 2
NUM_CODES = 4  # int8, int16, int32, int64: width 1 << code
MAX_WIDTH = 8
# The largest value each code 0..2 holds (code 3 holds the rest of int64); the least is -max - 1.
_CODE_MAXIMA = tuple(int(np.iinfo(t).max) for t in (np.int8, np.int16, np.int32))
_INT8_MAX, _INT16_MAX, _INT32_MAX = _CODE_MAXIMA
# Decoding status: which check a row failed (the kernel returns (status, row)).
_OK, _BAD_COUNT, _BAD_SIZE, _TOO_WIDE = range(4)


def _check_rows(values: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(values, int64 counts), checked: the kernels index `values` through `counts` unchecked."""
    values, counts = np.asarray(values), np.asarray(counts, dtype=np.int64)
    if values.dtype.kind not in "iu" or values.dtype == np.uint64:
        raise ValueError(f"CompressInt stores integers of at most 63 bits, got {values.dtype}")
    if len(counts) and (counts.min() < 0 or counts.max() > MAX_COUNT):
        raise ValueError(f"CompressInt rows hold 0 to {MAX_COUNT} values")
    if counts.sum() != len(values):
        raise ValueError(f"the row counts add up to {counts.sum()}, not to the {len(values)} values")
    return values, counts


@numba.njit(cache=True, inline="always")
def _code(value) -> int:
    """The width code of one value: 0 int8, 1 int16, 2 int32, 3 int64 (branch-free: token ids of
    mixed widths would make a branch mispredict on every other value)."""
    v = np.int64(value)
    return (
        np.int64(v > _INT8_MAX or v < -_INT8_MAX - 1)
        + np.int64(v > _INT16_MAX or v < -_INT16_MAX - 1)
        + np.int64(v > _INT32_MAX or v < -_INT32_MAX - 1)
    )


@numba.njit(cache=True)
def _sizes_kernel(values, counts):
    sizes = np.empty(len(counts), np.int64)
    position = 0
    for row in range(len(counts)):
        value_bytes = 0
        for i in range(position, position + counts[row]):
            value_bytes += 1 << _code(values[i])
        sizes[row] = COUNT_BYTES + (counts[row] + CODES_PER_BYTE - 1) // CODES_PER_BYTE + value_bytes
        position += counts[row]
    return sizes


@numba.njit(cache=True)
def _encode_kernel(values, counts, out, starts, ends):
    """Write row r into `out[starts[r]:ends[r]]`; returns the first row whose encoding does not
    take exactly those bytes (nothing is written past them), or -1.

    One pass over the values: each group of 4 writes its values, then their bitmap byte. Offsets
    into `out` are uint64: numba then drops its negative-index wrap-around, and LLVM merges the
    byte stores of a value into one 8-byte store.
    """
    position = 0
    for row in range(len(counts)):
        n = counts[row]
        p = np.uint64(starts[row])
        end = np.uint64(ends[row])
        bitmap_bytes = (n + CODES_PER_BYTE - 1) // CODES_PER_BYTE
        if p + np.uint64(COUNT_BYTES + bitmap_bytes) > end:
            return row
        for b in range(COUNT_BYTES):  # big-endian count
            out[p + np.uint64(b)] = (n >> (8 * (COUNT_BYTES - 1 - b))) & 0xFF
        bitmap = p + np.uint64(COUNT_BYTES)
        p = bitmap + np.uint64(bitmap_bytes)
        for q in range(bitmap_bytes):
            packed = 0
            for i in range(CODES_PER_BYTE * q, CODES_PER_BYTE * (q + 1)):
                code = 0  # the last bitmap byte is filled up with code 0
                if i < n:
                    v = np.int64(values[position + i])
                    code = _code(v)
                    width = np.uint64(1 << code)
                    if p + np.uint64(MAX_WIDTH) <= end:
                        # All 8 bytes of v (little-endian); the next values overwrite the surplus.
                        # A loop of fixed length becomes one store, with no branch on the width.
                        for b in range(MAX_WIDTH):
                            out[p + np.uint64(b)] = (v >> (8 * b)) & 0xFF
                    elif p + width <= end:
                        for b in range(width):
                            out[p + np.uint64(b)] = (v >> (8 * b)) & 0xFF
                    else:
                        return row
                    p += width
                packed = (packed << CODE_BITS) | code
            out[bitmap + np.uint64(q)] = packed
        if p != end:
            return row
        position += n
    return -1


def compress_int_sizes(values: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """int64 [R]: bytes of each row's encoding.

    Args:
        values: [N] integers of at most 63 bits, the rows concatenated.
        counts: [R] elements per row (sums to N).

    Raises:
        ValueError: values wider than 63 bits, or counts that are negative, over 2**32 - 1 or do
            not add up to N.
    """
    return _sizes_kernel(*_check_rows(values, counts))


def compress_int_into(
    values: np.ndarray, counts: np.ndarray, out: np.ndarray, starts: np.ndarray, sizes: np.ndarray
) -> None:
    """Encode row r into `out[starts[r] : starts[r] + sizes[r]]`, touching no other byte.

    Args:
        values: [N] integers of at most 63 bits, the rows concatenated.
        counts: [R] elements per row (sums to N).
        out: uint8 buffer.
        starts: [R] byte offset of each row in `out`.
        sizes: [R] bytes of each row's encoding, as `compress_int_sizes` gives them.

    Raises:
        ValueError: bad rows (see `compress_int_sizes`), a row's bytes lie outside `out`, or its
            encoding does not take `sizes[r]` bytes.
    """
    values, counts = _check_rows(values, counts)
    starts, sizes = np.asarray(starts, dtype=np.int64), np.asarray(sizes, dtype=np.int64)
    if out.dtype != np.uint8 or out.ndim != 1 or starts.shape != counts.shape or sizes.shape != counts.shape:
        raise ValueError("CompressInt output needs a flat uint8 buffer and one start and size per row")
    if len(counts) and (starts.min() < 0 or sizes.min() < 0 or (starts + sizes).max() > len(out)):
        raise ValueError(f"CompressInt rows do not fit the {len(out)}-byte output buffer")
    row = _encode_kernel(values, counts, out, starts, starts + sizes)
    if row >= 0:
        raise ValueError(f"row {row}: its CompressInt encoding does not take the {sizes[row]} bytes given")


def compress_int_rows(values: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every row encoded, back to back: (uint8 [B] the rows concatenated, int64 [R] bytes per row)."""
    sizes = compress_int_sizes(values, counts)
    out = np.empty(int(sizes.sum()), dtype=np.uint8)
    compress_int_into(values, counts, out, np.cumsum(sizes) - sizes, sizes)
    return out, sizes


@numba.njit(cache=True)
def _count_kernel(data, starts, sizes):
    """(status, failing row, int64 [R] element counts) read from the rows' big-endian headers."""
    counts = np.zeros(len(starts), np.int64)
    for row in range(len(starts)):
        if sizes[row] < COUNT_BYTES:
            return _BAD_COUNT, row, counts
        n = 0
        for b in range(COUNT_BYTES):
            n = (n << 8) | np.int64(data[starts[row] + b])
        # every value takes at least one byte: the row cannot hold more than this
        if COUNT_BYTES + (n + CODES_PER_BYTE - 1) // CODES_PER_BYTE + n > sizes[row]:
            return _BAD_COUNT, row, counts
        counts[row] = n
    return _OK, 0, counts


@numba.njit(cache=True)
def _decode_kernel(data, starts, sizes, counts, out, max_code):
    """Fill `out` with every row's values; (status, failing row). Offsets are uint64 as in
    `_encode_kernel`, so that the byte loads of a value merge into one 8-byte load."""
    position = 0
    for row in range(len(starts)):
        n = counts[row]
        bitmap = np.uint64(starts[row] + COUNT_BYTES)
        p = bitmap + np.uint64((n + CODES_PER_BYTE - 1) // CODES_PER_BYTE)
        end = np.uint64(starts[row] + sizes[row])
        for i in range(n):
            shift = CODE_BITS * (CODES_PER_BYTE - 1 - i % CODES_PER_BYTE)
            code = (np.int64(data[bitmap + np.uint64(i // CODES_PER_BYTE)]) >> shift) & (NUM_CODES - 1)
            width = np.uint64(1 << code)
            if code > max_code:
                return _TOO_WIDE, row
            if p + width > end:
                return _BAD_SIZE, row
            v = np.int64(0)
            if p + np.uint64(MAX_WIDTH) <= end:  # a fixed-length loop: one 8-byte load
                for b in range(MAX_WIDTH):
                    v |= np.int64(data[p + np.uint64(b)]) << (8 * b)
            else:  # within the row's last 7 bytes, read only the value's own bytes
                for b in range(width):
                    v |= np.int64(data[p + np.uint64(b)]) << (8 * b)
            unused_bits = 8 * (MAX_WIDTH - width)
            out[position + i] = (v << unused_bits) >> unused_bits  # keep the value's bytes, sign-extended
            p += width
        if p != end:
            return _BAD_SIZE, row
        position += n
    return _OK, 0


def decompress_int_rows(
    data: np.ndarray, starts: np.ndarray, sizes: np.ndarray, dtype: np.dtype | type = np.int64
) -> tuple[np.ndarray, np.ndarray]:
    """Decode the encoded rows at `[starts[r], starts[r] + sizes[r])` of `data`.

    Args:
        data: uint8 buffer (e.g. a whole memory-mapped shard).
        starts: [R] byte offset of each row; sizes: [R] its bytes.
        dtype: signed integer dtype of the values returned; a value stored wider is an error.

    Returns:
        (dtype [N] the values of all rows concatenated, int64 [R] elements per row).

    Raises:
        ShardFormatError: a row lies outside `data`, its count, bitmap and size disagree, or it holds
            a value wider than `dtype`; the message names the row (0 = the first given).
    """
    starts, sizes = np.asarray(starts, dtype=np.int64), np.asarray(sizes, dtype=np.int64)
    dtype = np.dtype(dtype)
    if data.dtype != np.uint8 or data.ndim != 1 or starts.ndim != 1 or starts.shape != sizes.shape:
        raise ValueError("CompressInt decoding needs a flat uint8 buffer and one start and size per row")
    if dtype.kind != "i":
        raise ValueError(f"CompressInt values decode into a signed integer dtype, got {dtype}")
    if len(starts) and (starts.min() < 0 or sizes.min() < 0 or (starts + sizes).max() > len(data)):
        raise ShardFormatError(f"CompressInt rows run outside the {len(data)}-byte buffer")
    status, row, counts = _count_kernel(data, starts, sizes)
    if status == _OK:
        values = np.empty(int(counts.sum()), dtype=dtype)
        status, row = _decode_kernel(data, starts, sizes, counts, values, dtype.itemsize.bit_length() - 1)
    if status == _BAD_COUNT:
        raise ShardFormatError(f"row {row}: CompressInt count does not fit the row's {sizes[row]} bytes")
    if status == _BAD_SIZE:
        raise ShardFormatError(f"row {row}: CompressInt widths do not add up to the row's {sizes[row]} bytes")
    if status == _TOO_WIDE:
        raise ShardFormatError(f"row {row}: CompressInt holds a value wider than {dtype}")
    return values, counts


def _width_codes_reference(values: np.ndarray) -> np.ndarray:
    """uint8 [N]: the width code of every value (0 int8, 1 int16, 2 int32, 3 int64)."""
    values = values.astype(np.int64)
    codes = np.zeros(len(values), dtype=np.uint8)
    for maximum in _CODE_MAXIMA:  # one code up for every range a value leaves
        codes += (values > maximum) | (values < -maximum - 1)
    return codes


def _row_layout(counts: np.ndarray, widths: np.ndarray, starts: np.ndarray) -> tuple[np.ndarray, ...]:
    """Where every value goes, for rows of `counts` values of `widths` bytes starting at `starts`.

    Returns:
        (int64 [N] row of every value, int64 [N] its index in the row, int64 [N] byte offset of its
        first byte).
    """
    row_of = np.repeat(np.arange(len(counts)), counts)
    first_value = np.cumsum(counts) - counts
    width_before = np.concatenate([[0], np.cumsum(widths)])  # value bytes of all earlier values
    value_bytes_start = starts + COUNT_BYTES + (counts + CODES_PER_BYTE - 1) // CODES_PER_BYTE
    offsets = value_bytes_start[row_of] + width_before[:-1] - width_before[first_value][row_of]
    return row_of, np.arange(len(row_of)) - first_value[row_of], offsets


def compress_int_rows_reference(values: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """numpy twin of `compress_int_rows`: (uint8 [B] rows concatenated, int64 [R] bytes per row)."""
    values, counts = _check_rows(values, counts)
    values = values.astype(np.int64)
    codes = _width_codes_reference(values)
    widths = np.left_shift(1, codes, dtype=np.int64)
    row_bytes = np.bincount(np.repeat(np.arange(len(counts)), counts), weights=widths, minlength=len(counts))
    sizes = COUNT_BYTES + (counts + CODES_PER_BYTE - 1) // CODES_PER_BYTE + row_bytes.astype(np.int64)
    starts = np.cumsum(sizes) - sizes
    row_of, index_in_row, offsets = _row_layout(counts, widths, starts)
    out = np.zeros(int(sizes.sum()), dtype=np.uint8)
    out[starts[:, None] + np.arange(COUNT_BYTES)] = counts.astype(">u4").view(np.uint8).reshape(-1, COUNT_BYTES)
    bitmap_bytes = starts[row_of] + COUNT_BYTES + index_in_row // CODES_PER_BYTE
    shifts = CODE_BITS * (CODES_PER_BYTE - 1 - index_in_row % CODES_PER_BYTE)
    np.bitwise_or.at(out, bitmap_bytes, (codes << shifts).astype(np.uint8))
    little_endian = values.astype("<i8").view(np.uint8).reshape(-1, MAX_WIDTH)
    kept = np.arange(MAX_WIDTH) < widths[:, None]
    out[(offsets[:, None] + np.arange(MAX_WIDTH))[kept]] = little_endian[kept]
    return out, sizes


def decompress_int_rows_reference(data: np.ndarray, starts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """numpy twin of `decompress_int_rows` with int64 values, for well-formed rows starting at `starts`."""
    starts = np.asarray(starts, dtype=np.int64)
    count_bytes = data[starts[:, None] + np.arange(COUNT_BYTES)].astype(np.int64)
    counts = (count_bytes << (8 * np.arange(COUNT_BYTES - 1, -1, -1))).sum(axis=1)
    row_of = np.repeat(np.arange(len(counts)), counts)
    index_in_row = np.arange(len(row_of)) - (np.cumsum(counts) - counts)[row_of]
    bitmap_bytes = data[starts[row_of] + COUNT_BYTES + index_in_row // CODES_PER_BYTE].astype(np.int64)
    codes = (bitmap_bytes >> (CODE_BITS * (CODES_PER_BYTE - 1 - index_in_row % CODES_PER_BYTE))) & (NUM_CODES - 1)
    widths = np.left_shift(1, codes, dtype=np.int64)
    offsets = _row_layout(counts, widths, starts)[2]
    kept = np.arange(MAX_WIDTH) < widths[:, None]
    little_endian = np.zeros((len(codes), MAX_WIDTH), dtype=np.uint8)
    little_endian[kept] = data[(offsets[:, None] + np.arange(MAX_WIDTH))[kept]]
    values = little_endian.view("<i8").ravel()
    unused_bits = 8 * (MAX_WIDTH - widths)
    return (values << unused_bits) >> unused_bits, counts
