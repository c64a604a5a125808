"""The data `train` reads, seen the same way by every command: one default split, Megatron's sample counts
in `build-indices`, and `inspect-index`'s training view of a blend (of any formats)."""

from __future__ import annotations

import json

import numpy as np

from indexed_dataset import convert
from samplers import GPTDatasetConfig, build_gpt_datasets
from samplers.cli import main as build_indices
from samplers.prebuild import BuildIndicesConfig
from samplers.run_length import RunLength
from samplers.splits import DEFAULT_SPLIT
from samplers.t5.dataset import T5DatasetConfig
from samplers.view import TrainingViewConfig
from trainer.config import DataConfig
from trainer.cli.inspect import main as inspect_index

SEQ = 64


def test_one_default_split_everywhere():
    assert DEFAULT_SPLIT == "969,30,1"  # Megatron-LM's --split default
    assert DataConfig().split == DEFAULT_SPLIT
    assert TrainingViewConfig(sequence_length=SEQ).split == DEFAULT_SPLIT
    assert BuildIndicesConfig(seq_length=SEQ, data_path=["x"]).dataset_config().split == DEFAULT_SPLIT
    assert T5DatasetConfig(data_prefix="x", sentinel_ids=range(100), pad_id=0, decoder_start_id=0, eos_id=1).split \
        == DEFAULT_SPLIT


def test_build_indices_from_a_runs_length_prebuilds_trains_cache(golden, tmp_path):
    prefix = str(golden / "sample_en_eod_text_document")
    cache = tmp_path / "cache"
    assert build_indices(["--data-path", prefix, "--split", "90,5,5", "--seq-length", str(SEQ), "--train-iters", "20",
                          "--global-batch-size", "8", "--eval-interval", "5", "--eval-iters", "2",
                          "--data-cache-path", str(cache)]) == 0
    built = sorted(p.name for p in cache.iterdir())
    sizes = RunLength(train_iters=20, global_batch_size=8, eval_interval=5, eval_iters=2).sizes()
    assert sizes == (160, 80, 16)
    config = GPTDatasetConfig(sequence_length=SEQ, blend=([prefix], None), split="90,5,5", path_to_cache=str(cache))
    build_gpt_datasets(config, sizes)  # what train builds for the same flags: only cache hits
    assert sorted(p.name for p in cache.iterdir()) == built


def test_training_view_of_a_blend_shows_trains_samples(golden, tmp_path, capsys):
    a = str(golden / "sample_en_eod_text_document")
    b = str(tmp_path / "b_arrow")
    convert(str(golden / "sample_en_noeod_text_document"), b, "arrow")
    cache = str(tmp_path / "cache")
    assert inspect_index(["--data-path", "0.3", a, "0.7", b, "--seq-length", str(SEQ), "--split", "90,5,5",
                          "--num-samples", "100", "20", "10", "--samples", "0,7,-1", "--data-cache-path", cache,
                          "--json"]) == 0
    view = json.loads(capsys.readouterr().out)["training"]["splits"]
    config = GPTDatasetConfig(sequence_length=SEQ, blend=([a, b], [0.3, 0.7]), split="90,5,5", path_to_cache=cache)
    datasets = build_gpt_datasets(config, (100, 20, 10))
    for split, dataset in zip(view, datasets):
        assert split["num_samples"] == len(dataset)
        assert [m["path"] for m in split["members"]] == [a, b]
        for item in (0, 7, -1):
            expected = dataset[item]
            tokens = np.array(split["samples"][str(item)]["tokens"])
            assert (tokens[:-1] == expected["tokens"].numpy()).all() and tokens[-1] == expected["labels"][-1]
            assert split["samples"][str(item)]["member"] == int(dataset.dataset_index[item])
    assert inspect_index(["--data-path", "0.3", a, "0.7", b, "--seq-length", str(SEQ), "--split", "90,5,5",
                          "--num-samples", "100", "20", "10", "--data-cache-path", cache]) == 0
    text = capsys.readouterr().out
    assert "blend of 2 datasets, 100 samples" in text and b in text


def test_training_view_without_a_dataset_needs_a_blend(capsys):
    assert inspect_index(["--seq-length", str(SEQ)]) != 0
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "--data-path" in error
