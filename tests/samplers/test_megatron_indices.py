"""megatron-core 0.16.1's own index arrays are reproduced exactly: values and dtypes, every split."""

from __future__ import annotations

import numpy as np
import pytest

from samplers import GPTDatasetConfig, build_gpt_datasets
from samplers.builder import MidLevelSplit, build_split_indices
from samplers.cli import main
from samplers.errors import EmptySplitError
from samplers.splits import SPLIT_NAMES

CASES = ("single_split", "single_one_epoch", "blend_two")


def golden_config(case: dict, golden, tmp_path) -> GPTDatasetConfig:
    prefixes, weights = case["config"]["blend"]
    return GPTDatasetConfig(
        sequence_length=case["config"]["sequence_length"],
        random_seed=case["config"]["random_seed"],
        blend=([str(golden / p) for p in prefixes], weights),
        split=case["config"]["split"],
        path_to_cache=str(tmp_path / "cache"),
    )


def assert_same_array(ours: np.ndarray, path) -> None:
    expected = np.load(path)
    assert ours.dtype == expected.dtype, path.name
    np.testing.assert_array_equal(ours, expected, err_msg=path.name)


def mid_levels(split):
    return [split] if isinstance(split, MidLevelSplit) else split.members


@pytest.mark.parametrize("name", CASES)
def test_index_arrays_equal_megatron(name, manifest, golden, golden_indices, tmp_path):
    case = manifest[name]
    splits = build_split_indices(golden_config(case, golden, tmp_path), case["config"]["sizes"])
    checked = set()
    for split_name, split, length in zip(SPLIT_NAMES, splits, case["dataset_lengths"]):
        if length is None:
            assert split is None
            continue
        assert len(split) == length
        if not isinstance(split, MidLevelSplit):
            for kind in ("dataset_index", "dataset_sample_index"):
                file = f"{name}-BlendedDataset-{split_name}-{kind}.npy"
                assert_same_array(getattr(split, kind), golden_indices / file)
                checked.add(file)
        for member in mid_levels(split):
            basename = member.dataset.prefix.rsplit("/", 1)[-1]
            for kind in ("document_index", "sample_index", "shuffle_index"):
                file = f"{name}-GPTDataset-{basename}-{split_name}-{kind}.npy"
                assert_same_array(getattr(member.indices, kind), golden_indices / file)
                checked.add(file)
    assert checked == set(case["files"])


@pytest.mark.parametrize("name", CASES)
def test_sample_tokens_equal_megatron(name, manifest, golden, tmp_path):
    case = manifest[name]
    datasets = build_gpt_datasets(golden_config(case, golden, tmp_path), case["config"]["sizes"])
    for key, expected in case["first_16_tokens_of_samples"].items():
        split, index = int(key[5]), int(key[7:-1])
        item = datasets[split][index]
        # With the extra token, tokens are the sample's first L ids.
        assert item["tokens"][:16].tolist() == expected, key


def test_second_build_loads_the_same_arrays_from_the_cache(manifest, golden, golden_indices, tmp_path):
    case = manifest["single_split"]
    config = golden_config(case, golden, tmp_path)
    build_split_indices(config, case["config"]["sizes"])
    train = build_split_indices(config, case["config"]["sizes"])[0]
    assert isinstance(train.indices.sample_index, np.memmap)
    assert_same_array(
        train.indices.shuffle_index,
        golden_indices / "single_split-GPTDataset-sample_en_eod_text_document-train-shuffle_index.npy",
    )


def test_empty_split_with_requested_samples_is_an_error_not_a_hang(golden, tmp_path):
    # 949,50,1 of 232 sequences leaves test = [232, 232); megatron-core loops forever here.
    config = GPTDatasetConfig(
        sequence_length=128,
        blend=([str(golden / "sample_en_eod_text_document")], None),
        split="949,50,1",
        path_to_cache=str(tmp_path),
    )
    with pytest.raises(EmptySplitError, match="test split .* covers no sequence of the 232"):
        build_split_indices(config, (100, 10, 5))
    assert build_split_indices(config, (100, 10, None))[2] is None


def test_cli_reports_the_empty_split_in_one_line(golden, tmp_path, capsys):
    argv = ["--data-path", str(golden / "sample_en_eod_text_document"), "--split", "949,50,1",
            "--seq-length", "128", "--test-samples", "5", "--data-cache-path", str(tmp_path)]
    assert main(argv) == 1
    error_lines = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert len(error_lines) == 1 and "covers no sequence" in error_lines[0]
