"""`build-indices`: the CLI builds the cache, reports timings as one JSON line and dumps arrays."""

from __future__ import annotations

import json

import numpy as np
import pytest

from samplers.cli import main


def blend_two_argv(golden, tmp_path) -> list[str]:
    return ["--data-path", "0.7", str(golden / "sample_en_eod_text_document"),
            "0.3", str(golden / "sample_en_noeod_text_document"),
            "--split", "90,8,2", "--seq-length", "256", "--seed", "42",
            "--train-samples", "3000", "--valid-samples", "100", "--test-samples", "10",
            "--data-cache-path", str(tmp_path / "cache")]


def test_dump_of_a_blend_equals_megatrons_arrays(golden, golden_indices, manifest, tmp_path, capsys):
    assert main(blend_two_argv(golden, tmp_path) + ["--dump", str(tmp_path / "dump"), "--timings"]) == 0
    timings = json.loads(capsys.readouterr().out.strip())
    assert set(timings) == {"document_index", "sample_index", "shuffle_index", "blend_index"}
    assert all(seconds >= 0 for seconds in timings.values())
    for file in manifest["blend_two"]["files"]:
        parts = file[: -len(".npy")].split("-")
        if parts[1] == "BlendedDataset":
            ours = tmp_path / "dump" / parts[2] / f"{parts[3]}.npy"
        else:
            ours = tmp_path / "dump" / parts[3] / parts[2] / f"{parts[4]}.npy"
        expected = np.load(golden_indices / file)
        assert np.load(ours).dtype == expected.dtype
        np.testing.assert_array_equal(np.load(ours), expected)


def test_second_run_loads_the_cache_and_builds_nothing(golden, tmp_path, capsys):
    assert main(blend_two_argv(golden, tmp_path)) == 0
    capsys.readouterr()
    assert main(blend_two_argv(golden, tmp_path) + ["--timings"]) == 0
    assert json.loads(capsys.readouterr().out) == {
        "document_index": 0.0, "sample_index": 0.0, "shuffle_index": 0.0, "blend_index": 0.0}


def test_single_dataset_dump_layout(golden, tmp_path):
    argv = ["--data-path", str(golden / "sample_en_noeod_text_document"), "--split", "90,10,0",
            "--seq-length", "64", "--seed", "7", "--data-cache-path", str(tmp_path / "c"), "--dump", str(tmp_path / "d")]
    assert main(argv) == 0
    assert sorted(p.name for p in (tmp_path / "d").iterdir()) == ["train", "valid"]
    assert sorted(p.name for p in (tmp_path / "d" / "train").iterdir()) == [
        "document_index.npy", "sample_index.npy", "shuffle_index.npy"]


def test_per_split_data_paths(golden, tmp_path, capsys):
    argv = ["--train-data-path", str(golden / "sample_en_eod_text_document"),
            "--valid-data-path", str(golden / "sample_en_noeod_text_document"),
            "--seq-length", "128", "--data-cache-path", str(tmp_path), "--timings"]
    assert main(argv) == 0
    assert json.loads(capsys.readouterr().out)["sample_index"] > 0


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--data-path", "missing/prefix", "--seq-length", "8"], "no such file"),
        (["--data-path", "0.5", "a", "b", "c", "--seq-length", "8"], "weight prefix"),
        (["--data-path", "x", "--split", "0,0,0", "--seq-length", "8"], "must not all be zero"),
        (["--seq-length", "8"], "data_path"),
        (["--data-path", "x"], "--seq-length"),
        (["--data-path", "x", "--seq-length", "many"], "invalid int value"),
    ],
)
def test_errors_are_one_line_and_a_nonzero_exit(argv, message, tmp_path, capsys):
    assert main(argv + ["--data-cache-path", str(tmp_path)]) == 1
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and message in error[0] and error[0].startswith("build-indices: error:")
