"""Multi-shard MindRecord keeps the document order; `convert` to mmap picks Megatron's dtype.

MindSpore cuts every `write_raw_data` call into consecutive parts, one per shard. Our writer always
writes as one call of the whole stream, so the shards read in turn give the documents in order, and
a dataset is found by the name the commands print (`x.mindrecord`) as well as by any of its shards.
"""

import json
import logging
import os
from pathlib import Path

import numpy as np
import pytest

from indexed_dataset import IndexedDataset, IndexedDatasetWriter, convert, open_reader
from indexed_dataset.errors import ShardFormatError
from indexed_dataset.format import MEGATRON_UINT16_VOCAB_LIMIT
from indexed_dataset.mindrecord import MindRecordWriter, _ShardFile
from indexed_dataset.mindrecord_reader import MindRecordReader, _written_in_several_calls, read_header

FIXTURES = Path(__file__).resolve().parents[2] / "data_test" / "mindrecord"
FIXTURE_SIZES = {"header_size": 64 * 2**10, "page_size": 32 * 2**10}  # what the fixtures were written with


def write_documents(path: Path, documents: list[list[int]], num_shards: int, batch: int, dtype=np.int32) -> None:
    """Write `documents` (one sequence each) into a MindRecord, `batch` documents per add_documents call."""
    with MindRecordWriter(str(path), dtype, num_shards=num_shards, **FIXTURE_SIZES) as writer:
        for start in range(0, len(documents), batch):
            for document in documents[start : start + batch]:
                writer.add_document(np.asarray(document, dtype=np.int64), [len(document)])


def write_mmap(prefix: Path, documents: list[list[int]], dtype=np.int32) -> str:
    with IndexedDatasetWriter(str(prefix), dtype) as writer:
        for document in documents:
            writer.add_document(np.asarray(document), [len(document)])
    return str(prefix)


def documents_of(reader) -> list[list[int]]:
    return [reader.document(i).tolist() for i in range(reader.num_documents)]


@pytest.fixture(scope="module")
def records() -> list[list[int]]:
    return json.loads((FIXTURES / "records.json").read_text())


@pytest.fixture
def corpus() -> list[list[int]]:
    """2,275 documents of 1..40 ids, each different (its first id is its number)."""
    rng = np.random.default_rng(10)
    return [[i, *rng.integers(0, 50_000, rng.integers(0, 40)).tolist()] for i in range(2275)]


def test_small_batches_into_three_shards_give_mindspores_one_call_files(records, tmp_path):
    write_documents(tmp_path / "ours.mindrecord", records, num_shards=3, batch=7)
    for shard in range(3):
        ours, theirs = tmp_path / f"ours.mindrecord{shard}", FIXTURES / f"tokens_3shard.mindrecord{shard}"
        assert ours.read_bytes()[FIXTURE_SIZES["header_size"]:] == theirs.read_bytes()[FIXTURE_SIZES["header_size"]:]
        assert read_header(str(ours))["page"] == read_header(str(theirs))["page"]


@pytest.mark.parametrize("name", ["tokens_3shard.mindrecord", "tokens_3shard.mindrecord0", "tokens_3shard.mindrecord2"])
def test_mindspore_shards_read_in_document_order_by_any_name(records, name):
    reader = MindRecordReader(str(FIXTURES / name))
    assert documents_of(reader) == records
    assert [os.path.basename(p) for p in reader.paths] == [f"tokens_3shard.mindrecord{i}" for i in range(3)]


def test_four_shards_convert_back_to_every_document_in_order(corpus, tmp_path, caplog):
    source = write_mmap(tmp_path / "src", corpus)
    with caplog.at_level(logging.INFO, logger="indexed_dataset.convert"):
        convert(source, str(tmp_path / "x.mindrecord"), "mindrecord", num_shards=4, batch_documents=100)
    assert "x.mindrecord0..3" in caplog.text
    assert not (tmp_path / "x.mindrecord").exists()
    assert sorted(p.name for p in tmp_path.glob(".*")) == []  # no spool or temporary left
    reader = MindRecordReader(str(tmp_path / "x.mindrecord"))
    assert len(reader.paths) == 4 and reader.num_documents == len(corpus)
    convert(str(tmp_path / "x.mindrecord"), str(tmp_path / "back"), "mmap", batch_documents=64)
    assert documents_of(IndexedDataset(str(tmp_path / "back"))) == corpus


def test_rows_that_do_not_divide_go_to_the_first_shards(tmp_path):
    documents = [[i] for i in range(10)]
    write_documents(tmp_path / "r.mindrecord", documents, num_shards=4, batch=3)
    shards = [MindRecordReader(str(tmp_path / f"r.mindrecord{i}"))._shards[i] for i in range(4)]
    assert [len(s.token_counts) for s in shards] == [3, 3, 2, 2]
    assert documents_of(MindRecordReader(str(tmp_path / "r.mindrecord"))) == documents


def test_fewer_documents_than_shards_leave_empty_shards_that_still_read(tmp_path):
    write_documents(tmp_path / "few.mindrecord", [[7, 8], [9]], num_shards=4, batch=1)
    assert documents_of(MindRecordReader(str(tmp_path / "few.mindrecord3"))) == [[7, 8], [9]]


def test_shards_written_in_several_calls_are_refused_with_their_counts(tmp_path, monkeypatch):
    """What MindSpore leaves after several write_raw_data calls: shards more than one row apart."""
    monkeypatch.setattr("indexed_dataset.mindrecord._shard_ranges", lambda rows, shards: [(0, 6), (6, 8), (8, 10)])
    write_documents(tmp_path / "calls.mindrecord", [[i] for i in range(10)], num_shards=3, batch=10)
    with pytest.raises(ShardFormatError, match=r"calls.mindrecord1: its 3 shards hold 6, 2, 2 rows .* order is lost"):
        MindRecordReader(str(tmp_path / "calls.mindrecord1"))


def test_blob_pages_after_raw_pages_mean_several_calls():
    def page(page_id: int, kind: str) -> dict:
        return {"page_id": page_id, "page_type": kind}

    one_call = {"page": [page(0, "BLOB_DATA"), page(1, "BLOB_DATA"), page(2, "RAW_DATA")]}
    two_calls = {"page": [page(0, "BLOB_DATA"), page(1, "RAW_DATA"), page(2, "BLOB_DATA"), page(3, "RAW_DATA")]}
    assert not _written_in_several_calls(one_call)
    assert _written_in_several_calls(two_calls)


def test_a_failure_while_publishing_shards_leaves_no_shard(tmp_path, monkeypatch):
    published = []
    real_publish = _ShardFile.publish

    def publish_then_fail(shard):
        if published:
            raise KeyboardInterrupt
        real_publish(shard)
        published.append(shard)

    monkeypatch.setattr(_ShardFile, "publish", publish_then_fail)
    with pytest.raises(KeyboardInterrupt):
        write_documents(tmp_path / "p.mindrecord", [[1], [2], [3]], num_shards=3, batch=1)
    assert published and os.listdir(tmp_path) == []


@pytest.mark.parametrize(
    "largest_id, stored, expected",
    [
        (MEGATRON_UINT16_VOCAB_LIMIT - 2, np.int32, np.uint16),  # largest id + 1 < 65,500: uint16
        (MEGATRON_UINT16_VOCAB_LIMIT - 1, np.int32, np.int32),  # Megatron's cliff, not 65,536
        (300, np.int64, np.uint16),
        (2**40, np.int64, np.int64),  # beyond int32: the source's dtype
    ],
)
def test_convert_to_mmap_picks_megatrons_dtype_from_the_ids(largest_id, stored, expected, tmp_path):
    documents = [[0, 5], [largest_id, 1]]
    write_documents(tmp_path / "d.mindrecord", documents, num_shards=1, batch=1, dtype=stored)
    convert(str(tmp_path / "d.mindrecord"), str(tmp_path / "out"), "mmap")
    converted = IndexedDataset(str(tmp_path / "out"))
    assert converted.dtype == expected and documents_of(converted) == documents


def test_convert_to_mmap_keeps_negative_ids_and_an_explicit_dtype(tmp_path):
    source = write_mmap(tmp_path / "neg", [[-3, 4], [5]], dtype=np.int16)
    convert(source, str(tmp_path / "kept"), "mmap")
    assert IndexedDataset(str(tmp_path / "kept")).dtype == np.int16
    convert(write_mmap(tmp_path / "small", [[1, 2]]), str(tmp_path / "wide"), "mmap", dtype=np.int64)
    assert IndexedDataset(str(tmp_path / "wide")).dtype == np.int64


def test_other_targets_keep_the_sources_dtype(tmp_path):
    source = write_mmap(tmp_path / "s", [[1, 2], [3]], dtype=np.int32)
    convert(source, str(tmp_path / "a"), "arrow")
    assert open_reader(str(tmp_path / "a")).dtype == np.int32
