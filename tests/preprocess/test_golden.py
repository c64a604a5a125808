"""preprocess-data and merge-datasets reproduce Megatron's own output files byte for byte."""

from __future__ import annotations

import os
import shutil

import pytest

from preprocess import cli, merge_cli

from preprocess_testing import GOLDEN, GPT2_FLAGS, SAMPLE, same_dataset


def golden(name: str) -> str:
    return os.path.join(GOLDEN, name)


@pytest.mark.parametrize(
    ("flags", "outputs"),
    [
        (["--append-eod"], {"text": "sample_en_eod_text_document"}),
        ([], {"text": "sample_en_noeod_text_document"}),
        (["--json-keys", "text", "src", "--append-eod"],
         {"text": "sample_en_eod_text_document", "src": "sample_en_keys_src_document"}),
    ],
)
def test_preprocess_matches_megatron_bytes(tmp_path, flags, outputs):
    prefix = str(tmp_path / "out")
    assert cli.main(["--input", SAMPLE, "--output-prefix", prefix, *GPT2_FLAGS, *flags]) == 0
    for key, golden_name in outputs.items():
        assert same_dataset(f"{prefix}_{key}_document", golden(golden_name))


@pytest.mark.parametrize(
    "runtime",
    [
        ["--workers", "1", "--chunk-bytes", "30000"],
        ["--workers", "1", "--partitions", "3", "--chunk-bytes", "50000"],
        ["--workers", "2", "--chunk-bytes", "40000"],
        ["--workers", "2", "--partitions", "2", "--keep-sequential-samples", "--chunk-bytes", "100000"],
    ],
)
def test_output_is_the_same_for_any_workers_partitions_and_chunking(tmp_path, runtime, files_in):
    prefix = str(tmp_path / "out")
    argv = ["--input", SAMPLE, "--output-prefix", prefix, *GPT2_FLAGS, "--json-keys", "text", "src", "--append-eod"]
    assert cli.main(argv + runtime) == 0
    assert same_dataset(prefix + "_text_document", golden("sample_en_eod_text_document"))
    assert same_dataset(prefix + "_src_document", golden("sample_en_keys_src_document"))
    # Partition scratch files are gone; the run's done marker is in out_done/.
    assert files_in() == ["out_done"] + sorted(f"out_{key}_document.{ext}" for key in ("text", "src")
                                               for ext in ("bin", "idx"))


def test_merge_directory_matches_megatron(tmp_path):
    source = tmp_path / "in"
    source.mkdir()
    for name in ("sample_en_eod_text_document", "sample_en_noeod_text_document"):
        for ext in (".bin", ".idx"):
            shutil.copy(golden(name + ext), source / (name + ext))
    prefix = str(tmp_path / "merged")
    assert merge_cli.main(["--input", str(source), "--output-prefix", prefix]) == 0
    assert same_dataset(prefix, golden("merged_eod_then_noeod"))


def test_merge_explicit_prefixes_keeps_the_given_order(tmp_path):
    prefix = str(tmp_path / "merged")
    inputs = [golden("sample_en_eod_text_document"), golden("sample_en_noeod_text_document")]
    assert merge_cli.main(["--inputs", *inputs, "--output-prefix", prefix]) == 0
    assert same_dataset(prefix, golden("merged_eod_then_noeod"))


def test_merge_rejects_a_directory_with_a_stray_file(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("x")
    assert merge_cli.main(["--input", str(tmp_path), "--output-prefix", str(tmp_path / "m")]) == 1
    assert "notes.txt" in capsys.readouterr().err
