"""`train` reads every format tokenmill writes: an Arrow or MindRecord copy of a token file gives the same
batches (and the same run) as the `.bin/.idx` pair, with index caches kept apart per copy."""

from __future__ import annotations

import os

import pytest
import torch
from trainer_testing import TINY_VOCAB, tiny_config

from indexed_dataset import convert
from samplers.sources import TokenSource
from trainer.config import DataConfig
from trainer.data.batches import Vocabulary, check_data_files, step_iterator
from trainer.models.gpt.data import build_datasets, collate
from trainer.errors import TrainConfigError
from trainer.train import train

STEPS = 3
MICRO_BATCH, MICRO_BATCHES = 2, 4


@pytest.fixture(scope="module")
def copies(tmp_path_factory, tiny_prefix) -> dict[str, str]:
    """The tiny token file as mmap (the original), Arrow folder and MindRecord file."""
    directory = tmp_path_factory.mktemp("formats")
    arrow, mindrecord = str(directory / "tiny_arrow"), str(directory / "tiny.mindrecord")
    convert(tiny_prefix, arrow, "arrow")
    convert(tiny_prefix, mindrecord, "mindrecord")
    return {"mmap": tiny_prefix, "arrow": arrow, "mindrecord": mindrecord}


def batches(path: str, cache: str, split: str = "98,1,1") -> list:
    """The first training steps' micro-batches `train` builds from `path` (all three splits built)."""
    data = DataConfig(dataset=[path], split=split, data_cache_path=cache)
    train_ds, valid_ds, _ = build_datasets(data, 32, Vocabulary(TINY_VOCAB, None, None), (STEPS * 8, 16, 8))
    steps = step_iterator(train_ds, 0, MICRO_BATCH, MICRO_BATCHES, 0, 1, TINY_VOCAB, collate)
    valid = step_iterator(valid_ds, 0, MICRO_BATCH, MICRO_BATCHES, 0, 1, TINY_VOCAB, collate)
    return [mb for _, step in zip(range(STEPS), steps) for mb in step] + next(valid)


@pytest.mark.parametrize("fmt", ["arrow", "mindrecord"])
def test_batches_equal_the_mmap_copys(copies, fmt, tmp_path):
    expected, got = batches(copies["mmap"], str(tmp_path / "a")), batches(copies[fmt], str(tmp_path / "b"))
    assert len(got) == len(expected) == STEPS * MICRO_BATCHES + MICRO_BATCHES
    for mine, theirs in zip(got, expected):
        assert torch.equal(mine.tokens, theirs.tokens) and torch.equal(mine.targets, theirs.targets)
        assert torch.equal(mine.position_ids, theirs.position_ids)


def test_a_blend_may_mix_formats(copies, tmp_path):
    data = DataConfig(data_path=["0.5", copies["arrow"], "0.5", copies["mindrecord"]], split="98,1,1",
                      data_cache_path=str(tmp_path))
    train_ds, _, _ = build_datasets(data, 32, Vocabulary(TINY_VOCAB, None, None), (40, 8, 8))
    assert len(train_ds) == 40 and train_ds[0]["tokens"].shape == (32,)


@pytest.mark.parametrize("fmt", ["arrow", "mindrecord"])
def test_index_cache_is_keyed_by_the_files_read(copies, fmt, tmp_path):
    cache = tmp_path / "cache"
    batches(copies[fmt], str(cache))
    done = sorted(p.name for p in cache.glob("*.done"))
    assert done and all(name.startswith(os.path.basename(copies[fmt])) for name in done)
    batches(copies[fmt], str(cache))  # a second run loads the same entries
    assert sorted(p.name for p in cache.glob("*.done")) == done
    source = TokenSource(copies[fmt])
    assert source.files() and all(os.path.isfile(f) for f in source.files())
    # Rewriting a data file (new mtime) gives new keys: stale indices are never reused.
    data_file, before = source.files()[0], source.fingerprint()
    stat = os.stat(data_file)
    os.utime(data_file, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    assert TokenSource(copies[fmt]).fingerprint() != before
    os.utime(data_file, ns=(stat.st_atime_ns, stat.st_mtime_ns))


def test_mmap_cache_keys_are_unchanged(copies):
    fingerprint = TokenSource(copies["mmap"]).fingerprint()
    assert set(fingerprint) == {"prefix", "bin_size", "bin_mtime_ns", "idx_size", "idx_mtime_ns"}


@pytest.mark.timeout(300)
def test_training_from_arrow_repeats_the_mmap_run(copies, reference, cache_dir):
    config = tiny_config(copies["arrow"], cache_dir, eval_iters=1)
    result = train(config)
    assert result.losses == reference["losses"]


def test_a_missing_dataset_is_one_line(tmp_path):
    with pytest.raises(TrainConfigError, match="not found"):
        check_data_files(DataConfig(dataset=[str(tmp_path / "nothing.mindrecord")]))
    folder = tmp_path / "plain_folder"
    folder.mkdir()
    with pytest.raises(TrainConfigError, match="not a saved Arrow dataset"):
        check_data_files(DataConfig(dataset=[str(folder)]))
