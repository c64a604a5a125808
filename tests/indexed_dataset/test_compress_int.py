"""CompressInt: the numba kernels agree with the format description and with their numpy twins."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from indexed_dataset.compress_int import (
    compress_int_into,
    compress_int_rows,
    compress_int_rows_reference,
    compress_int_sizes,
    decompress_int_rows,
    decompress_int_rows_reference,
)
from indexed_dataset.errors import ShardFormatError

INT64 = (-(2**63), 2**63 - 1)


def reference_compress_int(row: list[int]) -> bytes:
    """CompressInt of one row, value by value, straight from the format description."""
    widths = [next(w for w in (1, 2, 4, 8) if -(2 ** (8 * w - 1)) <= v < 2 ** (8 * w - 1)) for v in row]
    codes = [w.bit_length() - 1 for w in widths] + [0] * (-len(row) % 4)
    bitmap = bytes(c0 << 6 | c1 << 4 | c2 << 2 | c3 for c0, c1, c2, c3 in zip(*[iter(codes)] * 4))
    values = b"".join(v.to_bytes(w, "little", signed=True) for v, w in zip(row, widths))
    return len(row).to_bytes(4, "big") + bitmap + values


def flat(rows: list[list[int]], dtype=np.int64) -> tuple[np.ndarray, np.ndarray]:
    return np.array([v for row in rows for v in row], dtype=dtype), np.array([len(r) for r in rows], dtype=np.int64)


def starts_of(sizes: np.ndarray) -> np.ndarray:
    return np.cumsum(sizes) - sizes


# Values near every width boundary, so that rows mix all four codes.
boundaries = st.sampled_from([b + d for b in (0, 2**7, 2**15, 2**31, 2**63 - 1) for d in (-1, 0, 1)])
int64_values = st.one_of(st.integers(*INT64), boundaries, boundaries.map(lambda v: -v - 1))
int64_rows = st.lists(st.lists(int64_values.filter(lambda v: INT64[0] <= v <= INT64[1]), max_size=20), max_size=6)
token_rows = st.lists(st.lists(st.integers(0, 2**16 - 1), max_size=40), max_size=8)  # uint16 token ids


def test_layout_is_count_bitmap_then_narrowed_values():
    encoded, sizes = compress_int_rows(np.array([1, -300, 70000, -1, 2**40]), np.array([5]))
    # count 5 (u32 BE); codes int8,int16,int32,int8 | int64 -> 0b00_01_10_00, 0b11_000000; values LE
    expected = (
        bytes([0, 0, 0, 5, 0b00011000, 0b11000000]) + b"\x01" + (-300).to_bytes(2, "little", signed=True)
        + (70000).to_bytes(4, "little") + b"\xff" + (2**40).to_bytes(8, "little")
    )
    assert encoded.tobytes() == expected
    assert sizes.tolist() == [len(expected)]


@settings(max_examples=100, deadline=None)
@given(st.one_of(int64_rows, token_rows))
def test_kernels_match_the_description_and_the_numpy_twins(rows):
    values, counts = flat(rows)
    encoded, sizes = compress_int_rows(values, counts)
    assert encoded.tobytes() == b"".join(reference_compress_int(row) for row in rows)
    twin, twin_sizes = compress_int_rows_reference(values, counts)
    assert encoded.tobytes() == twin.tobytes()
    assert sizes.tolist() == twin_sizes.tolist() == compress_int_sizes(values, counts).tolist()
    decoded, decoded_counts = decompress_int_rows(encoded, starts_of(sizes), sizes)
    twin_values, twin_counts = decompress_int_rows_reference(encoded, starts_of(sizes))
    assert decoded.dtype == np.int64
    assert decoded.tolist() == twin_values.tolist() == values.tolist()
    assert decoded_counts.tolist() == twin_counts.tolist() == counts.tolist()


@settings(max_examples=30, deadline=None)
@given(token_rows)
def test_token_dtypes_encode_alike_and_decode_into_the_asked_dtype(rows):
    values, counts = flat(rows)
    encoded, sizes = compress_int_rows(values, counts)
    for dtype in (np.uint16, np.int32, np.uint32):
        assert compress_int_rows(values.astype(dtype), counts)[0].tobytes() == encoded.tobytes()
    decoded, _ = decompress_int_rows(encoded, starts_of(sizes), sizes, np.int32)
    assert decoded.dtype == np.int32
    assert decoded.tolist() == values.tolist()


@settings(max_examples=30, deadline=None)
@given(int64_rows, st.lists(st.integers(0, 12), min_size=6, max_size=6))
def test_rows_written_in_place_touch_no_byte_outside_them(rows, gaps):
    # The kernel stores 8 bytes per value where it can: the surplus must stay inside the row.
    values, counts = flat(rows)
    sizes = compress_int_sizes(values, counts)
    starts = starts_of(sizes) + np.cumsum(gaps[: len(rows)] or [0])[: len(rows)]
    out = np.full(int(sizes.sum()) + sum(gaps) + 3, 0xAA, dtype=np.uint8)
    compress_int_into(values, counts, out, starts, sizes)
    inside = np.zeros(len(out), dtype=bool)
    for start, size in zip(starts, sizes):
        inside[start : start + size] = True
    assert (out[~inside] == 0xAA).all()
    assert out[inside].tobytes() == b"".join(reference_compress_int(row) for row in rows)


def test_a_value_wider_than_the_asked_dtype_is_an_error():
    encoded, sizes = compress_int_rows(np.array([5, 2**40]), np.array([1, 1]))
    with pytest.raises(ShardFormatError, match="row 1: CompressInt holds a value wider than int32"):
        decompress_int_rows(encoded, starts_of(sizes), sizes, np.int32)


def test_damaged_rows_are_errors_naming_the_row():
    encoded, sizes = compress_int_rows(np.array([1, 2, 3, 300]), np.array([1, 3]))
    starts = starts_of(sizes)
    with pytest.raises(ShardFormatError, match="row 1: CompressInt widths do not add up to the row's 10 bytes"):
        decompress_int_rows(np.append(encoded, np.uint8(0)), starts, sizes + np.array([0, 1]))  # a stray byte in row 1
    too_many = encoded.copy()
    too_many[starts[1] + 3] = 9  # a count of 9 needs at least 4 + 3 + 9 bytes
    with pytest.raises(ShardFormatError, match="row 1: CompressInt count does not fit the row's 9 bytes"):
        decompress_int_rows(too_many, starts, sizes)
    widened = encoded.copy()
    widened[starts[1] + 4] = 0b11111100  # three int64 codes: the values run past the row
    with pytest.raises(ShardFormatError, match="row 1: CompressInt widths do not add up"):
        decompress_int_rows(widened, starts, sizes)
    with pytest.raises(ShardFormatError, match="outside the 15-byte buffer"):
        decompress_int_rows(encoded, starts + 1, sizes)


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="at most 63 bits, got uint64"):
        compress_int_rows(np.array([1], dtype=np.uint64), np.array([1]))
    with pytest.raises(ValueError, match="decode into a signed integer dtype, got uint16"):
        decompress_int_rows(np.zeros(0, dtype=np.uint8), np.zeros(0), np.zeros(0), np.uint16)
    with pytest.raises(ValueError, match="the row counts add up to 3, not to the 2 values"):
        compress_int_sizes(np.array([1, 2]), np.array([1, 2]))
    with pytest.raises(ValueError, match="rows hold 0 to 4294967295 values"):
        compress_int_rows(np.array([1]), np.array([-1, 2]))
    values, counts = np.array([1, 2, 300]), np.array([2, 1])  # rows of 7 and 7 bytes
    with pytest.raises(ValueError, match="do not fit the 14-byte output buffer"):
        compress_int_into(values, counts, np.zeros(14, dtype=np.uint8), np.array([0, 8]), np.array([7, 7]))
    with pytest.raises(ValueError, match="do not fit the 14-byte output buffer"):
        compress_int_into(values, counts, np.zeros(14, dtype=np.uint8), np.array([0, 7]), np.array([7, -1]))
    with pytest.raises(ValueError, match="one start and size per row"):
        compress_int_into(values, counts, np.zeros(14, dtype=np.uint8), np.array([0]), np.array([7]))
    with pytest.raises(ValueError, match="one start and size per row"):
        decompress_int_rows(np.zeros(14, dtype=np.uint8), np.array([0, 7]), np.array([7]))
    out = np.full(16, 0xAA, dtype=np.uint8)
    with pytest.raises(ValueError, match="row 1: its CompressInt encoding does not take the 6 bytes given"):
        compress_int_into(values, counts, out, np.array([0, 7]), np.array([7, 6]))
    assert (out[13:] == 0xAA).all()  # nothing past the bytes given
    with pytest.raises(ValueError, match="row 1: its CompressInt encoding does not take the 8 bytes given"):
        compress_int_into(values, counts, out, np.array([0, 7]), np.array([7, 8]))
