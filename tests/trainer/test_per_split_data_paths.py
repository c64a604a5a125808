"""``train --train-data-path 0.5 A 0.5 B --valid-data-path C``: Megatron's per-split data paths, each split's
blend used whole, for GPT and T5; exclusive with ``--data-path``/``--dataset``/``--split``."""

import dataclasses
import json
import shutil

import numpy as np
import pytest
from trainer_testing import argv_for, t5_config, tiny_config

from samplers.builder import build_split_indices
from samplers.prebuild import BuildIndicesConfig
from samplers.t5.blend import T5BlendedDataset
from samplers.t5.dataset import T5Dataset
from trainer.cli.train import main
from trainer.config import DataConfig
from trainer.data.batches import Vocabulary, check_data_files
from trainer.errors import TrainConfigError
from trainer.models.gpt.data import build_datasets
from trainer.models.t5.config import build_t5_training_datasets, resolve_t5_special_ids
from trainer.models.t5.settings import t5_settings

STEPS = 2
# Samples per split for the dataset checks: (train, valid, test).
SIZES = (40, 4, 0)


def copies(prefix: str, directory, names=("a", "b", "c")) -> list[str]:
    """``prefix``'s .bin/.idx copied under three names (suffix kept: T5 reads ``*_text_sentence``)."""
    suffix = prefix.rsplit("_text_", 1)[1]
    made = []
    for name in names:
        to = str(directory / f"{name}_text_{suffix}")
        for extension in (".bin", ".idx"):
            shutil.copyfile(prefix + extension, to + extension)
        made.append(to)
    return made


def per_split(data: DataConfig, a: str, b: str, c: str) -> DataConfig:
    """``data`` reading the train split from 0.5 A 0.5 B and the valid split from C (no test split)."""
    return dataclasses.replace(data, dataset=[], data_path=[], split=None, train_data_path=["0.5", a, "0.5", b],
                               valid_data_path=[c])


def train_from_cli(config, tmp_path) -> list[dict]:
    """Run ``train`` on ``config``'s command line; the metrics records."""
    metrics = tmp_path / "metrics.jsonl"
    argv = argv_for(config)
    # argv_for writes "--split None" (the field's default is filled in as 969,30,1 without per-split paths).
    for flag, value in (("--metrics-file", config.logging.metrics_file), ("--split", "None")):
        at = argv.index(flag)
        assert argv[at + 1] == value
        del argv[at:at + 2]
    assert main([*argv, "--metrics-file", str(metrics), "--log-interval", "1"]) == 0
    return [json.loads(line) for line in metrics.read_text().splitlines()]


def test_gpt_trains_on_per_split_paths_with_build_indices_indices(tiny_prefix, tmp_path):
    a, b, c = copies(tiny_prefix, tmp_path)
    base = tiny_config(tiny_prefix, str(tmp_path / "cache"), train_iters=STEPS, eval_iters=1)
    config = dataclasses.replace(base, data=per_split(base.data, a, b, c))

    train, valid, test = build_datasets(config.data, config.model.seq_length, Vocabulary(size=256, eod_id=0, pad_id=None),
                                          SIZES)
    assert [member.dataset.prefix for member in train.datasets] == [a, b]
    assert set(np.unique(train.dataset_index)) == {0, 1}
    assert valid.dataset.prefix == c and len(valid) >= SIZES[1]
    assert test is None

    # The trainer's train split is build-indices' for the same flags.
    built = build_split_indices(BuildIndicesConfig(seq_length=config.model.seq_length,
                                                   train_data_path=config.data.train_data_path,
                                                   valid_data_path=config.data.valid_data_path,
                                                   data_cache_path=str(tmp_path / "build")).dataset_config(), SIZES)
    assert np.array_equal(built[0].dataset_index, train.dataset_index)
    assert np.array_equal(built[0].dataset_sample_index, train.dataset_sample_index)
    for ours, theirs in zip(train.datasets, built[0].members):
        assert np.array_equal(ours.indices.shuffle_index, theirs.indices.shuffle_index)
    assert np.array_equal(built[1].indices.sample_index, valid.indices.sample_index)

    records = train_from_cli(config, tmp_path)
    assert len([r for r in records if "split" not in r and "loss" in r]) == STEPS
    assert {r["split"] for r in records if "split" in r} == {"valid"}  # no test path: no test evaluation


def test_t5_trains_on_per_split_paths(sentence_prefix, data_test, tmp_path):
    a, b, c = copies(sentence_prefix, tmp_path)
    base = t5_config(sentence_prefix, data_test, str(tmp_path / "cache"), train_iters=STEPS)
    config = dataclasses.replace(base, data=per_split(base.data, a, b, c))

    special = resolve_t5_special_ids(config.data, t5_settings(config).vocab_extra_ids)
    train, valid, test = build_t5_training_datasets(config.data, t5_settings(config), special, SIZES)
    assert isinstance(train, T5BlendedDataset)
    assert [member.dataset.prefix for member in train.members] == [a, b]
    assert set(np.unique(train.dataset_index)) == {0, 1}
    # Each member used whole: its train split spans all its documents.
    assert all(tuple(member.document_range) == (0, member.dataset.num_documents) for member in train.members)
    assert isinstance(valid, T5Dataset) and valid.dataset.prefix == c and valid.split == "valid"
    assert test is None

    records = train_from_cli(config, tmp_path)
    assert len([r for r in records if "split" not in r and "loss" in r]) == STEPS


def test_t5_per_split_blend_is_the_data_path_blend_of_whole_members(sentence_prefix, data_test, tmp_path):
    """The per-split train blend is ``--data-path 0.5 A 0.5 B --split 1,0,0``'s train split: same math."""
    a, b, c = copies(sentence_prefix, tmp_path)
    base = t5_config(sentence_prefix, data_test, str(tmp_path / "cache"))
    special = resolve_t5_special_ids(base.data, t5_settings(base).vocab_extra_ids)
    ours = build_t5_training_datasets(per_split(base.data, a, b, c), t5_settings(base), special, SIZES)[0]
    whole = dataclasses.replace(base.data, dataset=[], data_path=["0.5", a, "0.5", b], split="1,0,0")
    theirs = build_t5_training_datasets(whole, t5_settings(base), special, (SIZES[0], None, None))[0]
    assert np.array_equal(ours.dataset_index, theirs.dataset_index)
    assert np.array_equal(ours.dataset_sample_index, theirs.dataset_sample_index)


@pytest.mark.parametrize(("extra", "expected"), [
    (["--data-path", "A", "--train-data-path", "B"],
     "--data-path (or --dataset) excludes --train-data-path, --valid-data-path and --test-data-path"),
    (["--dataset", "A", "--valid-data-path", "B"],
     "--data-path (or --dataset) excludes --train-data-path, --valid-data-path and --test-data-path"),
    (["--train-data-path", "A", "--split", "98,2,0"],
     "--split applies to --data-path only; per-split data paths are used whole"),
    (["--valid-data-path", "A"],
     "--valid-data-path and --test-data-path need --train-data-path (the train split's blend)"),
    (["--train-data-path", "0.5", "A", "B", "C"],
     "--train-data-path: blend '0.5 A B C': expected 'weight prefix' pairs or prefixes only"),
])
def test_exclusive_and_malformed_per_split_paths_are_one_line(extra, expected, capsys):
    assert main(["--num-layers", "2", "--device", "cpu", *extra]) != 0
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == [f"train: error: {expected}"]


def test_a_missing_file_of_any_split_is_named(tiny_prefix, tmp_path):
    a, b, c = copies(tiny_prefix, tmp_path)
    missing = str(tmp_path / "gone_text_document")
    data = DataConfig(train_data_path=["0.5", a, "0.5", b], valid_data_path=[c], test_data_path=[missing])
    with pytest.raises(TrainConfigError, match=f"^dataset {missing}: {missing}.bin not found$"):
        check_data_files(data)


def test_a_split_without_a_path_has_no_data():
    data = DataConfig(train_data_path=["A"], test_data_path=["C"])
    assert data.split is None
    assert [data.split_is_empty(name) for name in ("train", "valid", "test")] == [False, True, False]
    assert data.blend_per_split == [(["A"], None), None, (["C"], None)]
    with pytest.raises(TrainConfigError, match="not per-split data paths"):
        data.blend


def test_gpt_without_a_valid_path_trains_and_evaluates_only_test(tiny_prefix, tmp_path):
    a, _, c = copies(tiny_prefix, tmp_path)
    base = tiny_config(tiny_prefix, str(tmp_path / "cache"), train_iters=STEPS, eval_iters=1)
    data = dataclasses.replace(base.data, dataset=[], split=None, train_data_path=[a], test_data_path=[c])
    records = train_from_cli(dataclasses.replace(base, data=data), tmp_path)
    assert len([r for r in records if "split" not in r and "loss" in r]) == STEPS
    assert {r["split"] for r in records if "split" in r} == {"test"}
