"""Multi-shard MindRecord through the commands: preprocess-data names the shards it wrote,
inspect-index and convert find them by the dataset's name, merge-datasets joins multi-shard parts
(into as many shards, the bytes of one run) and creates its output directory."""

from __future__ import annotations

import logging
import os

import numpy as np

from indexed_dataset import IndexedDataset, IndexedDatasetWriter, convert, open_reader
from indexed_dataset.mindrecord_reader import read_header
from preprocess import cli, merge_cli
from trainer.cli import inspect as inspect_cli
from preprocess_testing import GPT2_FLAGS, write_jsonl

SHARDS = 4
DOCUMENTS = [{"text": " ".join(str((11 * i + j) % 700) for j in range(1 + i % 17))} for i in range(240)]


def preprocess(source: str, prefix: str, *flags: str) -> int:
    return cli.main(["--input", source, "--output-prefix", prefix, *GPT2_FLAGS, "--append-eod", "--chunk-bytes",
                     "1500", "--output-format", "mmap", "mindrecord", "--mindrecord-shards", str(SHARDS), *flags])


def documents_of(reader) -> list[list[int]]:
    return [reader.document(i).tolist() for i in range(reader.num_documents)]


def pages_and_rows(path: str) -> tuple[list, bytes]:
    """A data file's page table and everything after its header (the rows), without the shard names."""
    header = read_header(path)
    with open(path, "rb") as f:
        f.seek(header["header_size"])
        return header["page"], f.read()


def test_preprocess_names_the_shards_it_wrote_and_they_read_back_in_order(tmp_path, caplog, capsys):
    source = write_jsonl(str(tmp_path / "in.jsonl"), DOCUMENTS)
    with caplog.at_level(logging.INFO):
        assert preprocess(source, str(tmp_path / "x")) == 0
    done = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Done:")]
    assert len(done) == 1 and done[0].endswith(f"x_text_document.mindrecord0..{SHARDS - 1}")
    dataset = str(tmp_path / "x_text_document.mindrecord")
    assert not os.path.exists(dataset)

    assert inspect_cli.main([dataset, "--validate"]) == 0
    shown = capsys.readouterr().out
    assert all(f"x_text_document.mindrecord{i}" in shown for i in range(SHARDS))
    convert(dataset, str(tmp_path / "back"), "mmap")
    assert documents_of(IndexedDataset(str(tmp_path / "back"))) == documents_of(
        IndexedDataset(str(tmp_path / "x_text_document")))


def test_merged_multishard_parts_are_the_bytes_of_one_run(tmp_path):
    (tmp_path / "in").mkdir()
    write_jsonl(str(tmp_path / "in" / "a.jsonl"), DOCUMENTS[:100])
    write_jsonl(str(tmp_path / "in" / "b.jsonl"), DOCUMENTS[100:])
    (tmp_path / "parts").mkdir()
    for rank in range(2):
        assert preprocess(str(tmp_path / "in"), str(tmp_path / "parts" / "c"), "--rank", str(rank),
                          "--world-size", "2") == 0
    assert preprocess(str(tmp_path / "in"), str(tmp_path / "whole")) == 0
    assert merge_cli.main(["--input", str(tmp_path / "parts"), "--output-prefix", str(tmp_path / "m")]) == 0

    merged, whole = open_reader(str(tmp_path / "m.mindrecord")), open_reader(str(tmp_path / "whole_text_document.mindrecord"))
    assert len(merged.paths) == SHARDS
    for ours, single_run in zip(merged.paths, whole.paths):
        assert pages_and_rows(ours) == pages_and_rows(single_run)
    assert documents_of(merged) == documents_of(IndexedDataset(str(tmp_path / "whole_text_document")))


def test_merge_creates_a_missing_output_directory_and_removes_it_when_the_merge_fails(tmp_path, capsys):
    source = write_jsonl(str(tmp_path / "in.jsonl"), DOCUMENTS)
    assert preprocess(source, str(tmp_path / "x")) == 0
    inputs = [str(tmp_path / "x_text_document")] * 2
    assert merge_cli.main(["--inputs", *inputs, "--output-prefix", str(tmp_path / "new" / "dir" / "x")]) == 0
    assert IndexedDataset(str(tmp_path / "new" / "dir" / "x")).num_documents == 2 * len(DOCUMENTS)

    with IndexedDatasetWriter(str(tmp_path / "wide"), np.int32) as writer:  # found only while merging
        writer.add_document([1, 2], [2])
    argv = ["--inputs", inputs[0], str(tmp_path / "wide"), "--output-prefix", str(tmp_path / "other" / "dir" / "x")]
    assert merge_cli.main(argv) == 1
    assert "dtype int32 differs" in capsys.readouterr().err
    assert not (tmp_path / "other").exists()
