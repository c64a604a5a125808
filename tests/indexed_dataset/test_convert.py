"""`convert` between mmap, Arrow and MindRecord: tokens and boundaries round-trip exactly."""

import itertools
import json
import os
from pathlib import Path

import numpy as np
import pytest

from indexed_dataset import IndexedDataset, IndexedDatasetWriter, TokenmillError
from indexed_dataset.convert import convert
from indexed_dataset.formats import FORMATS, format_of, open_reader, open_writer
from preprocess.convert_cli import main

TARGET_NAMES = {"mmap": "out_text_document", "arrow": "out_arrow", "mindrecord": "out.mindrecord"}


def write_mmap(prefix, sentence_split: bool, seed: int = 3) -> IndexedDataset:
    """300 documents, some empty; with `sentence_split` several sequences each, some of length 0."""
    rng = np.random.default_rng(seed)
    with IndexedDatasetWriter(str(prefix), np.uint16) as writer:
        for d in range(300):
            if sentence_split:
                lengths = rng.integers(0, 20, rng.integers(0, 4))
            else:
                lengths = [] if d % 7 == 0 else [int(rng.integers(1, 40))]
            writer.add_document(rng.integers(0, 2**16, int(np.sum(lengths))), lengths)
    return IndexedDataset(str(prefix))


def assert_same_dataset(reader, source: IndexedDataset) -> None:
    assert reader.sequence_lengths.tolist() == source.sequence_lengths.tolist()
    assert reader.document_indices.tolist() == source.document_indices.tolist()
    assert reader.num_tokens == source.num_tokens
    batch = reader.read_documents(0, source.num_documents)
    assert np.array_equal(batch.tokens, source.tokens)
    assert all(np.array_equal(reader[i], source[i]) for i in range(0, len(source), 17))


@pytest.mark.parametrize("sentence_split", [False, True], ids=["documents", "sentences"])
@pytest.mark.parametrize("source_format,target_format", list(itertools.product(FORMATS, FORMATS)))
def test_every_conversion_round_trips_tokens_and_boundaries(tmp_path, source_format, target_format, sentence_split):
    original = write_mmap(tmp_path / "orig", sentence_split)
    source = str(tmp_path / ("src_" + TARGET_NAMES[source_format]))
    if source_format == "mmap":
        source = original.prefix
    else:
        convert(original.prefix, source, target_format=source_format)
    target = str(tmp_path / TARGET_NAMES[target_format])
    convert(source, target, target_format=target_format, batch_documents=64)
    assert format_of(target) == target_format
    converted = open_reader(target)
    assert_same_dataset(converted, original)
    back = str(tmp_path / "back")
    convert(target, back, target_format="mmap", dtype=np.uint16)
    restored = IndexedDataset(back)
    assert restored.dtype == np.uint16
    assert np.array_equal(restored.tokens, original.tokens)
    assert np.array_equal(restored.sequence_lengths, original.sequence_lengths)
    assert np.array_equal(restored.document_indices, original.document_indices)


def test_arrow_keeps_the_token_dtype_and_mindrecord_stores_int32(tmp_path):
    original = write_mmap(tmp_path / "orig", sentence_split=False)
    convert(original.prefix, str(tmp_path / "a"), target_format="arrow")
    convert(original.prefix, str(tmp_path / "m.mindrecord"), target_format="mindrecord")
    assert open_reader(str(tmp_path / "a")).dtype == np.uint16
    assert open_reader(str(tmp_path / "m.mindrecord")).dtype == np.int32


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_writer_follows_the_indexed_dataset_writer_protocol(tmp_path, fmt):
    path = str(tmp_path / TARGET_NAMES[fmt])
    with open_writer(fmt, path, np.uint16) as writer:
        writer.add_document([1, 2, 3], [3])
        writer.add_documents(np.array([4, 5, 6]), np.array([2, 1]), np.array([0, 1, 0, 1]))
    reader = open_reader(path)
    assert [reader[i].tolist() for i in range(len(reader))] == [[1, 2, 3], [4, 5], [6]]
    assert reader.document_indices.tolist() == [0, 1, 1, 2, 2, 3]


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_failing_block_leaves_nothing_that_looks_valid(tmp_path, fmt):
    path = str(tmp_path / TARGET_NAMES[fmt])
    with pytest.raises(RuntimeError):
        with open_writer(fmt, path, np.uint16) as writer:
            writer.add_document([1, 2, 3], [3])
            raise RuntimeError("interrupted")
    left = [n for root, _, names in os.walk(tmp_path) for n in names]
    assert left == []


def test_cli_converts_and_reports_errors_in_one_line(tmp_path, capsys):
    original = write_mmap(tmp_path / "orig", sentence_split=True)
    arrow, mindrecord = str(tmp_path / "a"), str(tmp_path / "m.mindrecord")
    assert main(["--from", "mmap", "--to", "arrow", original.prefix, arrow, "--arrow-shard-size", "4096"]) == 0
    argv = ["--from", "arrow", "--to", "mindrecord", arrow, mindrecord, "--mindrecord-page-size", "32768"]
    assert main(argv + ["--mindrecord-header-size", "16384"]) == 0
    assert_same_dataset(open_reader(mindrecord), original)
    capsys.readouterr()

    assert main(["--from", "mindrecord", "--to", "mmap", str(tmp_path / "none.mindrecord"), "x"]) == 1
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "none.mindrecord" in error
    assert main(["--from", "mmap", "--to", "arrow", original.prefix, arrow]) == 1
    assert "not empty" in capsys.readouterr().err
    wrong_option = ["--mindrecord-shards", "2"]
    assert main(["--from", "mmap", "--to", "arrow", original.prefix, str(tmp_path / "b"), *wrong_option]) == 1
    assert "--mindrecord-shards applies only to --to mindrecord" in capsys.readouterr().err
    assert main(["--from", "mmap", "--to", "mindrecord", original.prefix, str(tmp_path / "t.mindrecord"),
                 "--dtype", "int8"]) == 1
    assert "does not fit int8" in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "t.mindrecord")


def test_format_detection(tmp_path):
    assert format_of("data/x_text_document") == "mmap"
    assert format_of("data/x_text_document.idx") == "mmap"
    assert format_of("x.mindrecord") == format_of("x.mindrecord12") == "mindrecord"
    assert format_of("x/data-00000-of-00001.arrow") == "arrow"
    with pytest.raises(TokenmillError, match="without state.json"):
        format_of(str(tmp_path))


def test_mindspore_written_shards_convert_to_megatron_mmap(tmp_path):
    fixtures = Path(__file__).resolve().parents[2] / "data_test" / "mindrecord"
    records = json.loads((fixtures / "records.json").read_text())
    back = str(tmp_path / "from_mindspore")
    assert main(["--from", "mindrecord", "--to", "mmap", str(fixtures / "tokens_3shard.mindrecord1"), back,
                 "--dtype", "uint16"]) == 0
    dataset = IndexedDataset(back)
    assert dataset.dtype == np.uint16
    assert [dataset[i].tolist() for i in range(len(dataset))] == records
