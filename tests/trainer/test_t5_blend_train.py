"""``train --model t5 --data-path 0.7 A 0.3 B``: T5 trains on a weighted blend of sentence-split datasets."""

import dataclasses
import json
import shutil

from trainer_testing import argv_for, t5_config

from samplers.t5.blend import T5BlendedDataset
from trainer.cli.train import main
from trainer.models.t5.config import build_t5_training_datasets, resolve_t5_special_ids
from trainer.models.t5.settings import t5_settings

STEPS = 2


def copy_prefix(prefix: str, to: str) -> str:
    for suffix in (".bin", ".idx"):
        shutil.copyfile(prefix + suffix, to + suffix)
    return to


def test_t5_trains_on_a_weighted_blend(sentence_prefix, data_test, tmp_path):
    other = copy_prefix(sentence_prefix, str(tmp_path / "other_text_sentence"))
    config = t5_config(sentence_prefix, data_test, str(tmp_path / "cache"), train_iters=STEPS)
    data = dataclasses.replace(config.data, dataset=[], data_path=["0.7", sentence_prefix, "0.3", other])
    config = dataclasses.replace(config, data=data)

    special = resolve_t5_special_ids(config.data, t5_settings(config).vocab_extra_ids)
    train, valid, _ = build_t5_training_datasets(config.data, t5_settings(config), special, (40, 4, 0))
    assert isinstance(train, T5BlendedDataset) and len(train) == 28 + 12
    assert [member.dataset.prefix for member in train.members] == [sentence_prefix, other]

    metrics = tmp_path / "metrics.jsonl"
    argv = [a for a in argv_for(config) if a not in ("--metrics-file", config.logging.metrics_file)]
    assert main([*argv, "--metrics-file", str(metrics), "--log-interval", "1"]) == 0
    steps = [r for r in map(json.loads, metrics.read_text().splitlines()) if "split" not in r and "loss" in r]
    assert len(steps) == STEPS
