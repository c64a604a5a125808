"""preprocess-data input handling: formats accepted, bad input reported as `file:line: reason`."""

from __future__ import annotations

import gzip
import json
import os

import numpy as np
import pytest

from indexed_dataset import IndexedDataset
from preprocess import cli
from preprocess_testing import GPT2_FLAGS, GPT2_VOCAB, SAMPLE, read_bytes, same_dataset, write_jsonl

NULL_FLAGS = ["--tokenizer-type", "NullTokenizer", "--vocab-size", "1000"]
GOOD = [{"text": "1 2 3"}, {"text": "4 5"}]


def run(tmp_path, input_path, *flags, tokenizer=NULL_FLAGS):
    return cli.main(["--input", str(input_path), "--output-prefix", str(tmp_path / "out"), *tokenizer, *flags])


@pytest.mark.parametrize(
    ("raw", "bad_line", "reason"),
    [
        (b"not json\n", 3, "not valid JSON"),
        (b'{"txt": "1"}\n', 3, "missing key 'text'"),
        (b'{"text": 7}\n', 3, "key 'text' holds a number, expected a string or a list of strings"),
        (b'{"text": ["1", 2]}\n', 3, "holds an array"),
        (b'{"text": null}\n', 3, "holds null"),
        (b'["text"]\n', 3, "expected a JSON object, got an array"),
        (b'{"text": "1 \xff 2"}\n', 3, "invalid UTF-8"),
        (b"\n", 3, "empty line"),
        (b'{"text": "\\ud800"}\n', 3, "lone surrogate"),
        (b'{"text": "1"} {"text": "2"}\n', 3, "not valid JSON: Extra data"),
    ],
)
def test_bad_line_stops_with_file_line_reason_and_leaves_nothing(tmp_path, capsys, files_in, raw, bad_line, reason):
    source = write_jsonl(str(tmp_path / "in.jsonl"), GOOD, [raw, b'{"text": "6"}\n'])
    assert run(tmp_path, source) == 1
    error = capsys.readouterr().err.strip().splitlines()
    assert error[-1].startswith(f"preprocess-data: error: {source}:{bad_line}: ")
    assert reason in error[-1]
    assert files_in() == ["in.jsonl"]


def test_skip_invalid_skips_bad_lines_and_reports_them(tmp_path, caplog):
    source = write_jsonl(str(tmp_path / "in.jsonl"), GOOD, [b"oops\n", b'{"text": "9"}\n', b'{"x": 1}\n'])
    assert run(tmp_path, source, "--skip-invalid") == 0
    dataset = IndexedDataset(str(tmp_path / "out_text_document"))
    assert [dataset[i].tolist() for i in range(len(dataset))] == [[1, 2, 3], [4, 5], [9]]
    assert "skipped 2 invalid lines" in caplog.text
    assert f"{source}:3" in caplog.text and f"{source}:5" in caplog.text


def test_error_line_numbers_are_right_across_chunks_and_workers(tmp_path, capsys):
    # Ids inside NULL_FLAGS' vocabulary of 1000 (an id past it is an error of its own, on an earlier line).
    lines = [json.dumps({"text": f"{i % 1000} {(i + 1) % 1000}"}).encode() + b"\n" for i in range(3000)]
    lines[2500] = b"{broken\n"
    source = tmp_path / "in.jsonl"
    source.write_bytes(b"".join(lines))
    assert run(tmp_path, source, "--workers", "2", "--chunk-bytes", "4096") == 1
    assert f"{source}:2501: not valid JSON" in capsys.readouterr().err


def test_empty_file_is_an_error_unless_skipping(tmp_path, capsys):
    (tmp_path / "a.jsonl").write_bytes(b"")
    write_jsonl(str(tmp_path / "b.jsonl"), GOOD)
    assert run(tmp_path, tmp_path) == 1
    assert f"{tmp_path / 'a.jsonl'}: empty file" in capsys.readouterr().err
    assert run(tmp_path, tmp_path, "--skip-invalid") == 0
    assert len(IndexedDataset(str(tmp_path / "out_text_document"))) == 2


@pytest.mark.parametrize(
    ("argv", "code", "message"),
    [
        (["--input", "nope.jsonl", *NULL_FLAGS], 1, "nope.jsonl: no such file"),
        (["--input", SAMPLE, "--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", "no-vocab.json",
          "--merge-file", "m.txt"], 1, "no-vocab.json: GPT-2 vocab file not found"),
        (["--input", SAMPLE, *NULL_FLAGS, "--dataset-impl", "lazy"], 2, "dataset_impl 'lazy' is not supported"),
        (["--input", SAMPLE, *NULL_FLAGS, "--keep-newlines"], 2, "only apply with split_sentences"),
        (["--input", SAMPLE, *NULL_FLAGS, "--workers", "0"], 2, "workers must be >= 1"),
    ],
)
def test_configuration_errors_are_one_line(tmp_path, capsys, files_in, argv, code, message):
    assert cli.main([*argv, "--output-prefix", str(tmp_path / "out")]) == code
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and message in error[0]
    assert files_in() == []


def test_vocab_is_an_alias_of_vocab_file(tmp_path):
    flags = ["--tokenizer-type", "GPT2BPETokenizer", "--vocab", GPT2_VOCAB, *GPT2_FLAGS[4:]]
    assert cli.main(["--input", SAMPLE, "--output-prefix", str(tmp_path / "a"), *flags]) == 0
    assert cli.main(["--input", SAMPLE, "--output-prefix", str(tmp_path / "b"), *GPT2_FLAGS]) == 0
    assert same_dataset(str(tmp_path / "a_text_document"), str(tmp_path / "b_text_document"))


def test_gzip_glob_and_directory_inputs_give_the_same_output(tmp_path):
    data = read_bytes(SAMPLE)
    half = data.index(b"\n", len(data) // 2) + 1
    shards = tmp_path / "shards"
    shards.mkdir()
    (shards / "part-0.jsonl").write_bytes(data[:half])
    with gzip.open(shards / "part-1.jsonl.gz", "wb") as f:
        f.write(data[half:])
    (shards / "README.md").write_text("not an input")
    outputs = []
    for name, source in (("plain", SAMPLE), ("dir", shards), ("glob", shards / "part-*")):
        prefix = str(tmp_path / name)
        assert cli.main(["--input", str(source), "--output-prefix", prefix, *GPT2_FLAGS, "--chunk-bytes", "65536"]) == 0
        outputs.append(prefix + "_text_document")
    assert same_dataset(outputs[0], outputs[1]) and same_dataset(outputs[0], outputs[2])


def test_list_of_strings_is_a_document_of_already_split_sentences(tmp_path):
    source = write_jsonl(str(tmp_path / "in.jsonl"), [{"text": ["1 2", "", "3"]}, {"text": []}, {"text": "4"}])
    assert run(tmp_path, source, "--append-eod") == 0
    dataset = IndexedDataset(str(tmp_path / "out_text_document"))
    assert dataset.document_indices.tolist() == [0, 2, 2, 3]
    assert [dataset[i].tolist() for i in range(3)] == [[1, 2], [3, 999], [4, 999]]


def test_split_sentences_writes_sentence_level_output(tmp_path):
    source = write_jsonl(str(tmp_path / "in.jsonl"), [{"text": "Hello there. General Kenobi!\nYou are bold."}])
    flags = ["--split-sentences", "--append-eod", "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model",
             os.path.join(os.path.dirname(GPT2_VOCAB), os.pardir, "tokenizers", "hf-wordpiece")]
    assert run(tmp_path, source, *flags, tokenizer=[]) == 0
    dataset = IndexedDataset(str(tmp_path / "out_text_sentence"))
    assert dataset.num_documents == 1 and dataset.num_sequences == 3
    assert dataset.tokens[-1] == 3  # [SEP], the eod, closes the last sentence


def test_pipeline_reports_empty_documents(tmp_path, caplog):
    source = write_jsonl(str(tmp_path / "in.jsonl"), [{"text": ""}, {"text": "1"}, {"text": "  "}])
    assert run(tmp_path, source, "--append-eod") == 0
    dataset = IndexedDataset(str(tmp_path / "out_text_document"))
    assert dataset.document_indices.tolist() == [0, 0, 1, 1]
    assert np.array_equal(dataset.tokens, [1, 999])
    assert "3 documents, 2 tokens" in caplog.text and "2 empty documents" in caplog.text


@pytest.mark.parametrize("partitions", ["1", "2"])
def test_missing_output_directory_is_one_line(tmp_path, capsys, partitions):
    argv = ["--input", SAMPLE, *NULL_FLAGS, "--output-prefix", str(tmp_path / "no" / "out"), "--partitions", partitions]
    assert cli.main(argv) == 1
    assert f"{tmp_path / 'no'}: output directory does not exist" in capsys.readouterr().err
