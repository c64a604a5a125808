"""inspect-index opens every output format: mmap, Arrow (save_to_disk) and MindRecord give the same facts."""

from __future__ import annotations

import json

import pytest

from indexed_dataset import convert
from trainer.cli import inspect as inspect_cli
from indexed_dataset.inspect import inspect_dataset

GOLDEN_PREFIX = "sample_en_eod_text_document"
GPT2_FLAGS = ["--tokenizer-type", "GPT2BPETokenizer"]


@pytest.fixture(scope="module")
def outputs(golden, tmp_path_factory):
    """The golden mmap dataset and its Arrow and MindRecord conversions."""
    root = tmp_path_factory.mktemp("formats")
    mmap = str(golden / GOLDEN_PREFIX)
    arrow = str(root / "sample_arrow")
    mindrecord = str(root / "sample.mindrecord")
    convert(mmap, arrow, "arrow")
    convert(mmap, mindrecord, "mindrecord", header_size=2**16, page_size=2**16)
    return {"mmap": mmap, "arrow": arrow, "mindrecord": mindrecord}


@pytest.mark.parametrize("fmt", ["arrow", "mindrecord"])
def test_row_formats_report_the_same_counts_and_ids_as_mmap(outputs, fmt):
    reference = inspect_dataset(outputs["mmap"])
    report = inspect_dataset(outputs[fmt])
    assert report.format == fmt
    assert (report.documents, report.sequences, report.tokens, report.max_token_id) == (
        reference.documents, reference.sequences, reference.tokens, reference.max_token_id)
    assert report.document_lengths == reference.document_lengths
    assert all(size > 0 for size in report.files.values())


@pytest.mark.parametrize("fmt", ["mmap", "arrow", "mindrecord"])
def test_cli_validates_and_decodes_every_format(outputs, data_test, capsys, fmt):
    vocab = ["--vocab-file", str(data_test / "gpt2" / "gpt2-vocab.json"),
             "--merge-file", str(data_test / "gpt2" / "gpt2-merges.txt")]
    assert inspect_cli.main([outputs[fmt], "--validate", "--docs", "3", *GPT2_FLAGS, *vocab]) == 0
    text = capsys.readouterr().out
    assert f"format          {fmt}" in text and "--- document 3 ---" in text


def test_json_summary_names_the_format_and_its_files(outputs, capsys):
    assert inspect_cli.main([outputs["mindrecord"], "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["format"] == "mindrecord" and summary["version"] == "3.0"
    assert sorted(name.rsplit(".", 1)[-1] for name in summary["files"]) == ["db", "mindrecord"]


def test_a_damaged_mindrecord_is_one_clear_line(outputs, tmp_path, capsys):
    broken = tmp_path / "broken.mindrecord"
    broken.write_bytes(b"\x05\x00")
    assert inspect_cli.main([str(broken)]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "broken.mindrecord" in err[0]
