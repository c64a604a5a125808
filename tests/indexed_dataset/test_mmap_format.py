"""The Megatron `.bin/.idx` format: writer, reader, merge, validation, atomicity."""

import os
import struct

import numpy as np
import pytest

from indexed_dataset import (
    DType,
    IndexedDataset,
    IndexedDatasetWriter,
    IndexFormatError,
    TokenmillError,
    TokenRangeError,
    datasets_in_directory,
    merge_datasets,
    optimal_dtype,
)
from indexed_dataset.format import index_file_size, sequence_pointers

GOLDEN_PREFIXES = ["sample_en_eod_text_document", "sample_en_noeod_text_document", "sample_en_keys_src_document"]


def read_bytes(prefix, suffix):
    with open(f"{prefix}{suffix}", "rb") as f:
        return f.read()


def write_dataset(prefix, documents, dtype=np.uint16):
    """documents: list of lists of sequences (lists of ids)."""
    with IndexedDatasetWriter(str(prefix), dtype) as writer:
        for sequences in documents:
            ids = np.concatenate([np.asarray(s, dtype=np.int64) for s in sequences]) if sequences else []
            writer.add_document(ids, [len(s) for s in sequences])
    return IndexedDataset(str(prefix))


@pytest.mark.parametrize("name", GOLDEN_PREFIXES)
def test_rewriting_a_golden_file_document_by_document_gives_the_same_bytes(golden, tmp_path, name):
    source = IndexedDataset(golden / name)
    with IndexedDatasetWriter(str(tmp_path / "copy"), source.dtype) as writer:
        for d in range(source.num_documents):
            first, last = source.document_indices[d], source.document_indices[d + 1]
            writer.add_document(source.document(d), source.sequence_lengths[first:last])
    for suffix in (".bin", ".idx"):
        assert read_bytes(tmp_path / "copy", suffix) == read_bytes(golden / name, suffix)


def test_bulk_add_documents_equals_one_by_one(golden, tmp_path):
    source = IndexedDataset(golden / "sample_en_eod_text_document")
    with IndexedDatasetWriter(str(tmp_path / "bulk"), source.dtype) as writer:
        half = source.num_documents // 2
        for lo, hi in ((0, half), (half, source.num_documents)):
            tokens = np.concatenate([source.document(d) for d in range(lo, hi)])
            writer.add_documents(tokens, source.sequence_lengths[lo:hi], np.ones(hi - lo, dtype=np.int64))
    for suffix in (".bin", ".idx"):
        assert read_bytes(tmp_path / "bulk", suffix) == read_bytes(golden / "sample_en_eod_text_document", suffix)


def test_golden_files_read_and_validate(golden):
    ds = IndexedDataset(golden / "sample_en_eod_text_document")
    ds.validate()
    assert ds.dtype == np.uint16 and len(ds) == 232 and ds.num_documents == 232
    assert ds.num_tokens == int(ds.sequence_lengths.sum()) == 271237
    assert ds[0][-1] == 50256  # --append-eod puts <|endoftext|> last in every document
    assert np.array_equal(ds.get(3, offset=2, length=5), ds[3][2:7])
    assert [len(x) for x in ds[10:13]] == list(ds.sequence_lengths[10:13])


def test_sentences_and_empty_documents_round_trip(tmp_path):
    documents = [[[1, 2, 3], [4]], [], [[5, 6]], [[7], [8], [9, 10, 11]]]
    ds = write_dataset(tmp_path / "x", documents)
    ds.validate()
    assert list(ds.document_indices) == [0, 2, 2, 3, 6]
    assert [list(ds[i]) for i in range(len(ds))] == [[1, 2, 3], [4], [5, 6], [7], [8], [9, 10, 11]]
    assert list(ds.document(1)) == [] and list(ds.document(3)) == [7, 8, 9, 10, 11]


def test_an_empty_dataset_is_valid(tmp_path):
    ds = write_dataset(tmp_path / "empty", [])
    ds.validate()
    assert len(ds) == 0 and ds.num_documents == 0 and ds.num_tokens == 0


def test_low_level_add_item_end_document_api(tmp_path):
    with IndexedDatasetWriter(str(tmp_path / "x"), np.int32) as writer:
        writer.add_item([1, 2])
        writer.add_item([3])
        writer.end_document()
        writer.add_item([4])
    ds = IndexedDataset(str(tmp_path / "x"))
    assert ds.dtype == np.int32 and list(ds.document_indices) == [0, 2, 3]


@pytest.mark.parametrize(
    "vocab_size, megatron, tight",
    [(65499, np.uint16, np.uint16), (65500, np.int32, np.uint16), (65536, np.int32, np.uint16), (65537, np.int32, np.int32)],
)
def test_dtype_rules_at_the_uint16_boundary(vocab_size, megatron, tight):
    assert optimal_dtype(vocab_size) == megatron
    assert optimal_dtype(vocab_size, rule="tight") == tight


@pytest.mark.parametrize("dtype, bad_id", [(np.uint16, 65536), (np.uint16, -1), (np.int32, 2**31), (np.uint8, 256)])
def test_ids_that_do_not_fit_the_dtype_are_refused_naming_the_sequence(tmp_path, dtype, bad_id):
    with pytest.raises(TokenRangeError, match=r"token id .* in sequence 1 does not fit"):
        with IndexedDatasetWriter(str(tmp_path / "x"), dtype) as writer:
            writer.add_document([1, 2], [2])
            writer.add_document(np.array([3, bad_id], dtype=np.int64), [2])
    assert os.listdir(tmp_path) == []


def test_largest_uint16_id_fits(tmp_path):
    ds = write_dataset(tmp_path / "x", [[[0, 65535]]])
    assert list(ds[0]) == [0, 65535]


def test_an_interrupted_write_leaves_nothing_that_looks_complete(tmp_path):
    with pytest.raises(RuntimeError):
        with IndexedDatasetWriter(str(tmp_path / "x"), np.uint16) as writer:
            writer.add_document([1, 2, 3], [3])
            raise RuntimeError("killed")
    assert os.listdir(tmp_path) == []


def test_a_failed_rewrite_keeps_no_stale_pair_looking_new(tmp_path):
    write_dataset(tmp_path / "x", [[[1, 2]]])
    with pytest.raises(RuntimeError):
        with IndexedDatasetWriter(str(tmp_path / "x"), np.uint16) as writer:
            writer.add_document([9, 9, 9], [3])
            raise RuntimeError("killed")
    assert list(IndexedDataset(str(tmp_path / "x"))[0]) == [1, 2]  # the old pair is untouched


def test_pointers_are_int64_past_two_gibibytes():
    lengths = np.full(3, 2**31 - 1, dtype=np.int32)
    pointers = sequence_pointers(lengths, itemsize=4)
    assert pointers.dtype == np.int64
    assert list(pointers) == [0, (2**31 - 1) * 4, (2**31 - 1) * 8]


def test_merge_reproduces_megatron_merge_tool(golden, tmp_path):
    merge_datasets([golden / "sample_en_eod_text_document", golden / "sample_en_noeod_text_document"], str(tmp_path / "m"))
    for suffix in (".bin", ".idx"):
        assert read_bytes(tmp_path / "m", suffix) == read_bytes(golden / "merged_eod_then_noeod", suffix)


def test_merge_reads_back_as_a_then_b_with_documents_shifted(tmp_path):
    os.makedirs(tmp_path / "in")
    write_dataset(tmp_path / "in" / "b_second", [[[1], [2]], [[3]]])
    write_dataset(tmp_path / "in" / "a_first", [[[7, 8]]])
    prefixes = datasets_in_directory(str(tmp_path / "in"))["mmap"]
    assert [os.path.basename(p) for p in prefixes] == ["a_first", "b_second"]
    merge_datasets(prefixes, str(tmp_path / "m"))
    merged = IndexedDataset(str(tmp_path / "m"))
    merged.validate()
    assert [list(x) for x in merged[0:4]] == [[7, 8], [1], [2], [3]]
    assert list(merged.document_indices) == [0, 1, 3, 4]


def test_merge_refuses_mixed_dtypes_before_writing(tmp_path):
    write_dataset(tmp_path / "a", [[[1]]], np.uint16)
    write_dataset(tmp_path / "b", [[[1]]], np.int32)
    with pytest.raises(TokenmillError, match="dtype int32 differs"):
        merge_datasets([str(tmp_path / "a"), str(tmp_path / "b")], str(tmp_path / "m"))
    assert not (tmp_path / "m.idx").exists() and not (tmp_path / "m.bin").exists()


def test_directory_with_a_stray_or_unpaired_file_is_refused(tmp_path):
    write_dataset(tmp_path / "a", [[[1]]])
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(TokenmillError, match="notes.txt: not a .bin or .idx"):
        datasets_in_directory(str(tmp_path))
    os.remove(tmp_path / "notes.txt")
    os.remove(tmp_path / "a.bin")
    with pytest.raises(TokenmillError, match="missing its .bin"):
        datasets_in_directory(str(tmp_path))


# ------------------------------------------------------------------------------ damaged files
@pytest.fixture
def small(tmp_path):
    write_dataset(tmp_path / "x", [[[1, 2, 3]], [[4, 5]], [[6]]])
    return tmp_path / "x"


def corrupt(path, offset, data):
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


def test_missing_files_are_named(small):
    os.remove(f"{small}.bin")
    with pytest.raises(IndexFormatError, match=r"x\.bin: no such file"):
        IndexedDataset(str(small))


@pytest.mark.parametrize("size", [0, 10, 33, 40])
def test_truncated_index_is_refused(small, size):
    os.truncate(f"{small}.idx", size)
    with pytest.raises(IndexFormatError, match=r"x\.idx: "):
        IndexedDataset(str(small))


def test_truncated_data_is_refused(small):
    os.truncate(f"{small}.bin", 4)
    with pytest.raises(IndexFormatError, match=r"x\.bin: 4 bytes, but the index says 12 \(truncated\)"):
        IndexedDataset(str(small))


@pytest.mark.parametrize(
    "offset, data, message",
    [
        (0, b"XMIDIDX", "not an MMIDIDX index"),
        (9, struct.pack("<Q", 2), "unsupported version 2"),
        (17, bytes([9]), "unknown dtype code 9"),
        (18, struct.pack("<Q", 7), "needs exactly"),
        (34 + 12 * 3 + 8 * 3, struct.pack("<q", 5), "document indices run from 0 to 5"),
    ],
)
def test_damaged_headers_are_refused_with_the_problem(small, offset, data, message):
    corrupt(f"{small}.idx", offset, data)
    with pytest.raises(IndexFormatError, match=message):
        IndexedDataset(str(small))


def test_opening_finds_a_pointer_that_disagrees_with_the_lengths(small):
    corrupt(f"{small}.idx", 34 + 12 + 8, struct.pack("<q", 2))  # sequence 1 should point at byte 6
    with pytest.raises(IndexFormatError, match=r"x\.idx: sequence 1 points to byte 2 \(offset 54\)"):
        IndexedDataset(str(small))


def test_opening_finds_a_length_that_disagrees_with_the_data(small):
    corrupt(f"{small}.idx", 34, struct.pack("<i", 2))  # sequence 0 length 3 -> 2
    with pytest.raises(IndexFormatError, match="sequence 1 points to byte 6"):
        IndexedDataset(str(small))


def test_opening_finds_a_negative_length(small):
    corrupt(f"{small}.idx", 34 + 4, struct.pack("<i", -262732))
    with pytest.raises(IndexFormatError, match=r"sequence 1 has negative length -262732 \(offset 38\)"):
        IndexedDataset(str(small))


def test_validate_rechecks_files_changed_after_opening(small):
    ds = IndexedDataset(str(small))
    with open(f"{small}.bin", "ab") as f:
        f.write(b"\0\0")
    with pytest.raises(IndexFormatError, match="bytes, but the lengths add up to"):
        ds.validate()


def test_validate_finds_document_indices_going_backwards(tmp_path):
    write_dataset(tmp_path / "x", [[[1]], [[2]], [[3]]])
    corrupt(f"{tmp_path / 'x'}.idx", 34 + 12 * 3 + 8 * 1, struct.pack("<q", 2))  # [0, 2, 2, 3] fine
    corrupt(f"{tmp_path / 'x'}.idx", 34 + 12 * 3 + 8 * 2, struct.pack("<q", 1))  # [0, 2, 1, 3] not
    with pytest.raises(IndexFormatError, match="document index 2"):
        IndexedDataset(str(tmp_path / "x")).validate()


def test_a_pointer_past_the_data_is_refused_on_open(small):
    corrupt(f"{small}.idx", 34 + 12 + 8, struct.pack("<q", 10))
    with pytest.raises(IndexFormatError, match="sequence 1 points to byte 10"):
        IndexedDataset(str(small))


def test_a_reader_pickles_by_name_for_spawned_workers(golden):
    import pickle

    ds = IndexedDataset(golden / "sample_en_eod_text_document")
    copy = pickle.loads(pickle.dumps(ds))
    assert np.array_equal(copy[5], ds[5]) and copy.prefix == ds.prefix


def test_index_size_formula():
    assert index_file_size(232, 233) == os.path.getsize(
        os.path.join(os.path.dirname(__file__), "..", "..", "data_test", "megatron", "sample_en_eod_text_document.idx")
    )
    assert DType.code_of(np.uint16) == 8 and DType(4).numpy() == np.int32
