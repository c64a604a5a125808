"""preprocess-data --output-format: mmap, Arrow and MindRecord written in one pass, equal to converting
the mmap output; format options; kept fields; all outputs fail together."""

from __future__ import annotations

import os

import datasets
import numpy as np
import pytest

from indexed_dataset.convert import convert
from indexed_dataset.formats import open_reader
from preprocess import cli
from preprocess_testing import GPT2_FLAGS, read_bytes, write_jsonl


# Varied lengths, an empty document, and texts the sentence splitter cuts in several sentences.
DOCUMENTS = [{"text": " ".join(str((7 * i + j) % 900) for j in range(i % 13)) + (". 5 6. 7" if i % 4 else ""),
              "id": i, "src": f"shard{i % 3}", "score": i / 4} for i in range(300)]


def run(tmp_path, *flags, name="out", source=None):
    source = source or write_jsonl(str(tmp_path / "in.jsonl"), DOCUMENTS)
    return cli.main(["--input", source, "--output-prefix", str(tmp_path / name), *GPT2_FLAGS,
                     "--chunk-bytes", "2000", *flags])


def same_documents(reader_a, reader_b) -> bool:
    """Same tokens, sequence boundaries and document boundaries."""
    return (np.array_equal(reader_a.sequence_lengths, reader_b.sequence_lengths)
            and np.array_equal(reader_a.document_indices, reader_b.document_indices)
            and all(np.array_equal(reader_a[i], reader_b[i]) for i in range(len(reader_a))))


@pytest.mark.parametrize("level_flags", [["--append-eod"], ["--split-sentences"]], ids=["documents", "sentences"])
def test_every_format_in_one_pass_equals_converting_the_mmap_output(tmp_path, level_flags):
    assert run(tmp_path, "--output-format", "mmap", "arrow", "mindrecord", *level_flags) == 0
    level = "sentence" if "--split-sentences" in level_flags else "document"
    mmap = str(tmp_path / f"out_text_{level}")
    convert(mmap, str(tmp_path / "converted_arrow"), "arrow")
    convert(mmap, str(tmp_path / "converted.mindrecord"), "mindrecord")
    mmap_reader = open_reader(mmap)
    assert len(mmap_reader) > len(DOCUMENTS) if level == "sentence" else len(mmap_reader) < len(DOCUMENTS)
    for written, converted in ((f"{mmap}_arrow", tmp_path / "converted_arrow"),
                               (f"{mmap}.mindrecord", tmp_path / "converted.mindrecord")):
        assert same_documents(open_reader(written), mmap_reader)
        assert same_documents(open_reader(written), open_reader(str(converted)))
    loaded = datasets.load_from_disk(f"{mmap}_arrow")
    assert loaded.num_rows == len(DOCUMENTS)
    expected_columns = ["input_ids", "sequence_lengths"] if level == "sentence" else ["input_ids"]
    assert loaded.column_names == expected_columns
    assert loaded[5]["input_ids"] == mmap_reader.document(5).tolist()


def test_arrow_only_with_kept_fields(tmp_path, files_in):
    assert run(tmp_path, "--output-format", "arrow", "--keep-fields", "id,src,score") == 0
    # Beside the Arrow folder, its checksum manifest (indexed_dataset.checksums).
    assert files_in() == ["in.jsonl", "out_done", "out_text_document_arrow", "out_text_document_arrow.sha256sums"]
    loaded = datasets.load_from_disk(str(tmp_path / "out_text_document_arrow"))
    assert loaded.column_names == ["input_ids", "id", "src", "score"]
    assert loaded["id"] == [d["id"] for d in DOCUMENTS] and loaded["src"] == [d["src"] for d in DOCUMENTS]
    assert loaded["score"] == [d["score"] for d in DOCUMENTS]


def test_arrow_shard_size(tmp_path):
    source = write_jsonl(str(tmp_path / "in.jsonl"), [{"text": "a b c d"}] * 3000)
    assert run(tmp_path, "--output-format", "arrow", "--shard-size", "20000", source=source) == 0
    folder = tmp_path / "out_text_document_arrow"
    assert len([name for name in os.listdir(folder) if name.startswith("data-")]) > 1
    assert datasets.load_from_disk(str(folder)).num_rows == 3000


@pytest.mark.parametrize(
    ("bad", "reason"),
    [({"text": "1", "id": 3}, "missing field 'src'"),
     ({"text": "1", "id": [3], "src": "x"}, "field 'id' holds an array, expected a number or a string"),
     ({"text": "1", "id": True, "src": "x"}, "field 'id' holds a boolean, expected a number or a string"),
     ({"text": "1", "id": "3", "src": "x"}, "field 'id' holds a string, earlier lines held a number")],
)
def test_kept_fields_are_checked_like_keys(tmp_path, capsys, files_in, bad, reason):
    source = write_jsonl(str(tmp_path / "in.jsonl"), DOCUMENTS[:250] + [bad] + DOCUMENTS[250:])
    assert run(tmp_path, "--output-format", "mmap", "arrow", "--keep-fields", "id,src", source=source) == 1
    error = capsys.readouterr().err.strip().splitlines()
    assert error == [f"preprocess-data: error: {source}:251: {reason}"]
    assert files_in() == ["in.jsonl"]


def test_a_field_changing_type_in_a_later_chunk_fails(tmp_path, capsys):
    documents = [{"text": "1", "id": i} for i in range(400)] + [{"text": "1", "id": "x"}] * 400
    source = write_jsonl(str(tmp_path / "in.jsonl"), documents)
    first_chunk_bytes = len(b"".join(read_bytes(source).splitlines(keepends=True)[:400]))
    assert run(tmp_path, "--output-format", "arrow", "--keep-fields", "id", "--chunk-bytes", str(first_chunk_bytes),
               source=source) == 1
    assert "field 'id' holds string values, earlier documents held int64" in capsys.readouterr().err


def test_one_failing_writer_removes_every_output(tmp_path, capsys, files_in):
    empty_document_at_0 = DOCUMENTS  # document 0 has no tokens
    assert not empty_document_at_0[0]["text"]
    assert run(tmp_path, "--output-format", "mmap", "arrow", "mindrecord", "--empty-documents", "reject") == 1
    assert "empty" in capsys.readouterr().err
    assert files_in() == ["in.jsonl"]


def test_an_existing_output_fails_before_any_work(tmp_path, capsys, files_in):
    (tmp_path / "out_text_document_arrow").mkdir()
    (tmp_path / "out_text_document_arrow" / "keep.txt").write_text("mine")
    assert run(tmp_path, "--output-format", "mmap", "arrow") == 1
    assert "not empty" in capsys.readouterr().err
    assert files_in() == ["in.jsonl", "out_text_document_arrow"]
    assert os.listdir(tmp_path / "out_text_document_arrow") == ["keep.txt"]


@pytest.mark.parametrize("flags", [["--keep-fields", "id"], ["--shard-size", "10"], ["--mindrecord-shards", "2"],
                                   ["--empty-documents", "reject"]])
def test_an_option_of_a_format_not_written_is_refused(tmp_path, capsys, flags):
    assert run(tmp_path, *flags) == 2
    assert "apply to the" in capsys.readouterr().err


def test_merge_datasets_joins_row_formats_in_order_and_refuses_what_it_cannot_order(tmp_path, capsys):
    """Arrow datasets given one by one join like mmap ones (sentence lengths and kept fields too);
    datasets of two formats, or MindRecords of different shard counts (the merged one gets the parts'
    count), are one clear line. (Multi-shard parts that agree: test_multishard_mindrecord_commands.py.)"""
    from preprocess import merge_cli

    flags = ["--output-format", "mmap", "arrow", "--split-sentences", "--keep-fields", "id"]
    assert run(tmp_path, *flags, name="a", source=write_jsonl(str(tmp_path / "a.jsonl"), DOCUMENTS[:120])) == 0
    assert run(tmp_path, *flags, name="b", source=write_jsonl(str(tmp_path / "b.jsonl"), DOCUMENTS[120:])) == 0
    assert run(tmp_path, *flags, name="whole") == 0
    parts = [str(tmp_path / "a_text_sentence_arrow"), str(tmp_path / "b_text_sentence_arrow")]
    assert merge_cli.main(["--inputs", *parts, "--output-prefix", str(tmp_path / "ab")]) == 0
    merged, whole = open_reader(str(tmp_path / "ab_arrow")), open_reader(str(tmp_path / "whole_text_sentence_arrow"))
    assert same_documents(merged, whole)
    assert merged.field_values("id") == [d["id"] for d in DOCUMENTS]

    assert merge_cli.main(["--inputs", parts[0], str(tmp_path / "b_text_sentence"), "--output-prefix",
                           str(tmp_path / "mixed")]) == 1
    assert "must share one format" in capsys.readouterr().err
    (tmp_path / "shards").mkdir()
    convert(str(tmp_path / "a_text_sentence"), str(tmp_path / "shards" / "a.mindrecord"), "mindrecord", num_shards=2)
    convert(str(tmp_path / "b_text_sentence"), str(tmp_path / "shards" / "b.mindrecord"), "mindrecord", num_shards=3)
    assert merge_cli.main(["--input", str(tmp_path / "shards"), "--output-prefix", str(tmp_path / "m")]) == 1
    assert "different numbers of shards" in capsys.readouterr().err
