"""MindRecord: our writer reproduces MindSpore 2.10's files; our reader reads theirs and ours."""

import json
import os
import sqlite3
from pathlib import Path

import numpy as np
import pytest

from indexed_dataset import TokenmillError, TokenRangeError
from indexed_dataset.errors import ShardFormatError
from indexed_dataset.mindrecord import DEFAULT_HEADER_SIZE, DEFAULT_PAGE_SIZE, MindRecordWriter
from indexed_dataset.mindrecord_reader import MindRecordReader, read_header

FIXTURES = Path(__file__).resolve().parents[2] / "data_test" / "mindrecord"
FIXTURE_HEADER_SIZE = 64 * 2**10
FIXTURE_PAGE_SIZE = 32 * 2**10


@pytest.fixture(scope="module")
def records() -> list[list[int]]:
    return json.loads((FIXTURES / "records.json").read_text())


def flat(documents: list[list[int]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(tokens, sequence lengths, document sequence counts) with one sequence per non-empty document."""
    lengths = np.array([len(d) for d in documents], dtype=np.int64)
    tokens = np.concatenate([np.asarray(d, dtype=np.int64) for d in documents] + [np.zeros(0, np.int64)])
    return tokens, lengths[lengths > 0], (lengths > 0).astype(np.int64)


def write_fixture_copy(records, path: Path, num_shards: int, batch_size: int | None = None) -> None:
    with MindRecordWriter(
        str(path), np.int32, num_shards=num_shards, header_size=FIXTURE_HEADER_SIZE, page_size=FIXTURE_PAGE_SIZE
    ) as writer:
        step = batch_size or len(records)
        for start in range(0, len(records), step):
            writer.add_documents(*flat(records[start : start + step]))


def index_rows(db_path) -> list[tuple]:
    with sqlite3.connect(db_path) as db:
        rows = db.execute("SELECT * FROM INDEXES ORDER BY ROW_ID").fetchall()
    db.close()
    return rows


def assert_same_as_mindspore(ours: Path, theirs: Path) -> None:
    """Same header (names normalised), same pages byte for byte, same `.db` rows and shard name."""
    our_header, their_header = read_header(str(ours)), read_header(str(theirs))
    our_names = [n.replace(ours.name.rstrip("0123456789"), "X") for n in our_header.pop("shard_addresses")]
    their_names = [n.replace(theirs.name.rstrip("0123456789"), "X") for n in their_header.pop("shard_addresses")]
    assert our_names == their_names
    assert our_header == their_header
    our_bytes, their_bytes = ours.read_bytes(), theirs.read_bytes()
    assert len(our_bytes) == len(their_bytes)
    assert our_bytes[FIXTURE_HEADER_SIZE:] == their_bytes[FIXTURE_HEADER_SIZE:]
    assert index_rows(f"{ours}.db") == index_rows(f"{theirs}.db")
    with sqlite3.connect(f"{ours}.db") as db:
        assert db.execute("SELECT NAME FROM SHARD_NAME").fetchall() == [(ours.name,)]
    db.close()


def test_one_shard_reproduces_mindspore_file(records, tmp_path):
    write_fixture_copy(records, tmp_path / "ours.mindrecord", num_shards=1)
    assert_same_as_mindspore(tmp_path / "ours.mindrecord", FIXTURES / "tokens_1shard.mindrecord")


def test_three_shards_reproduce_mindspore_files(records, tmp_path):
    write_fixture_copy(records, tmp_path / "ours.mindrecord", num_shards=3)
    for shard in range(3):
        assert_same_as_mindspore(
            tmp_path / f"ours.mindrecord{shard}", FIXTURES / f"tokens_3shard.mindrecord{shard}"
        )
    assert read_header(str(tmp_path / "ours.mindrecord1"))["shard_addresses"] == [
        "ours.mindrecord0", "ours.mindrecord1", "ours.mindrecord2"
    ]


def test_streaming_in_small_batches_gives_the_same_file(records, tmp_path):
    write_fixture_copy(records, tmp_path / "batched.mindrecord", num_shards=1, batch_size=7)
    assert_same_as_mindspore(tmp_path / "batched.mindrecord", FIXTURES / "tokens_1shard.mindrecord")


@pytest.mark.parametrize("name", ["tokens_1shard.mindrecord", "tokens_3shard.mindrecord2"])
def test_reader_reads_mindspore_files(records, name):
    reader = MindRecordReader(str(FIXTURES / name))
    assert len(reader) == reader.num_documents == len(records)
    assert reader.dtype == np.int32
    assert reader.num_tokens == sum(map(len, records))
    assert all(np.array_equal(reader[i], records[i]) for i in range(len(records)))
    assert np.array_equal(reader.sequence_lengths, [len(r) for r in records])
    assert [r.tolist() for r in reader[10:13]] == records[10:13]


def test_empty_documents_are_written_and_read_back(tmp_path):
    documents = [[5, 6], [], [7], [], []]
    path = tmp_path / "e.mindrecord"
    with MindRecordWriter(str(path), np.uint16) as writer:
        writer.add_documents(*flat(documents))
    reader = MindRecordReader(str(path))
    assert reader.num_documents == 5
    assert reader.document_indices.tolist() == [0, 1, 1, 2, 2, 2]
    assert [reader.document(i).tolist() for i in range(5)] == documents
    assert len(index_rows(f"{path}.db")) == 5


def test_empty_documents_can_be_rejected_with_their_count(tmp_path):
    with pytest.raises(TokenmillError, match="2 empty documents.*first: document 1"):
        with MindRecordWriter(str(tmp_path / "r.mindrecord"), np.uint16, empty_documents="reject") as writer:
            writer.add_documents(*flat([[1], [], [2], []]))
    assert os.listdir(tmp_path) == []


def test_sentence_boundaries_need_store_sequence_lengths(tmp_path):
    tokens, lengths, counts = np.arange(10), np.array([3, 0, 4, 3]), np.array([2, 0, 2])
    with pytest.raises(TokenmillError, match="document 0 has 2 sequences"):
        with MindRecordWriter(str(tmp_path / "s.mindrecord"), np.uint16) as writer:
            writer.add_documents(tokens, lengths, counts)
    path = tmp_path / "kept.mindrecord"
    with MindRecordWriter(str(path), np.uint16, store_sequence_lengths=True) as writer:
        writer.add_documents(tokens, lengths, counts)
    header = read_header(str(path))
    assert header["schema"][0]["blob_fields"] == ["input_ids", "sequence_lengths"]
    reader = MindRecordReader(str(path))
    assert reader.sequence_lengths.tolist() == [3, 0, 4, 3]
    assert reader.document_indices.tolist() == [0, 2, 2, 4]
    assert [s.tolist() for s in reader[0:4]] == [[0, 1, 2], [], [3, 4, 5, 6], [7, 8, 9]]


def test_many_pages_follow_mindspore_page_rules(tmp_path):
    # 6000 one-token rows: 14-byte blobs fill a 32 KiB blob page with 2340 rows, whose 13-byte raw rows
    # (30420 bytes) leave no room for a second group, so each raw page holds one row group.
    documents = [[7]] * 6000
    path = tmp_path / "p.mindrecord"
    with MindRecordWriter(str(path), np.uint16, header_size=FIXTURE_HEADER_SIZE, page_size=FIXTURE_PAGE_SIZE) as w:
        for start in range(0, 6000, 999):
            w.add_documents(*flat(documents[start : start + 999]))
    pages = read_header(str(path))["page"]
    blob = [p for p in pages if p["page_type"] == "BLOB_DATA"]
    raw = [p for p in pages if p["page_type"] == "RAW_DATA"]
    assert [(p["start_row_id"], p["end_row_id"]) for p in blob] == [(0, 2340), (2340, 4680), (4680, 6000)]
    assert [p["page_id"] for p in raw] == [3, 4, 5]
    assert [p["page_type_id"] for p in raw] == [0, 4, 5]
    assert [p["row_group_ids"] for p in raw] == [[{"id": g, "offset": 0}] for g in range(3)]
    assert os.path.getsize(path) == FIXTURE_HEADER_SIZE + 5 * FIXTURE_PAGE_SIZE + 1320 * 13
    assert [r.tolist() for r in MindRecordReader(str(path))[:]] == documents


def test_default_sizes_leave_padding_as_holes(tmp_path):
    path = tmp_path / "d.mindrecord"
    with MindRecordWriter(str(path), np.uint16) as writer:
        writer.add_documents(*flat([[1, 2, 3]] * 10))
    header = read_header(str(path))
    assert (header["header_size"], header["page_size"]) == (DEFAULT_HEADER_SIZE, DEFAULT_PAGE_SIZE)
    apparent = os.path.getsize(path)
    assert apparent == DEFAULT_HEADER_SIZE + DEFAULT_PAGE_SIZE + 10 * 13
    assert os.stat(path).st_blocks * 512 < apparent // 100


def test_token_ids_are_range_checked_against_the_dtype(tmp_path):
    with pytest.raises(TokenRangeError, match="document 1"):
        with MindRecordWriter(str(tmp_path / "t.mindrecord"), np.uint16) as writer:
            writer.add_documents(*flat([[1], [70000]]))
    assert os.listdir(tmp_path) == []


def test_existing_output_is_refused(records, tmp_path):
    write_fixture_copy(records[:5], tmp_path / "x.mindrecord", num_shards=1)
    with pytest.raises(TokenmillError, match="already exists"):
        MindRecordWriter(str(tmp_path / "x.mindrecord"), np.int32)


def test_damaged_files_raise_one_clear_error(records, tmp_path):
    path = tmp_path / "x.mindrecord"
    write_fixture_copy(records[:5], path, num_shards=1)
    os.remove(f"{path}.db")
    with pytest.raises(ShardFormatError, match=r"x\.mindrecord\.db: no such file"):
        MindRecordReader(str(path))
    write_fixture_copy(records[:5], tmp_path / "cut.mindrecord", num_shards=1)
    with open(tmp_path / "cut.mindrecord", "r+b") as f:
        f.truncate(FIXTURE_HEADER_SIZE + 100)
    with pytest.raises(ShardFormatError, match=r"cut\.mindrecord: 65636 bytes, but its header's pages end at byte \d+ \(truncated\)"):
        MindRecordReader(str(tmp_path / "cut.mindrecord"))
    write_fixture_copy(records[:5], tmp_path / "bits.mindrecord", num_shards=1)
    with open(tmp_path / "bits.mindrecord", "r+b") as f:
        f.seek(FIXTURE_HEADER_SIZE + 8 + 4)  # row 0: [u64 LE blob len][u32 BE count][bitmap ...]
        f.write(b"\xff")  # four int64 width codes in an int32 field
    with pytest.raises(ShardFormatError, match=r"bits\.mindrecord: row 0: CompressInt holds a value wider than int32"):
        MindRecordReader(str(tmp_path / "bits.mindrecord")).document(0)
    path.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00not json at all!")
    with pytest.raises(ShardFormatError, match="no MindRecord JSON header"):
        MindRecordReader(str(path))
