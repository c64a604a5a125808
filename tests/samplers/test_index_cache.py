"""The index cache: keyed by everything that changes the arrays, atomic, safe with concurrent builders."""

from __future__ import annotations

import hashlib
import multiprocessing
import os

import numpy as np
import pytest

from samplers import GPTDatasetConfig
from samplers.builder import DEFAULT_CACHE_DIRNAME, build_split_indices
from samplers.cache import IndexCache
from samplers.gpt.indices import PhaseTimings

LENGTHS = np.random.RandomState(0).randint(1, 300, size=20_000)
SIZES = (50_000, 2_000, None)


def config(prefix: str, cache: str | None, **options) -> GPTDatasetConfig:
    fields = {"sequence_length": 64, "random_seed": 5, "split": "98,2,0", **options}
    return GPTDatasetConfig(blend=([prefix], None), path_to_cache=cache, **fields)


def cache_entries(directory) -> list[str]:
    return sorted(name for name in os.listdir(directory) if name.endswith(".done"))


def test_hit_loads_memory_maps_and_builds_nothing(positional_dataset, tmp_path):
    prefix = positional_dataset(LENGTHS[:500])
    first = build_split_indices(config(prefix, str(tmp_path / "c")), (100, 10, None))
    timings = PhaseTimings()
    second = build_split_indices(config(prefix, str(tmp_path / "c")), (100, 10, None), timings)
    assert timings.as_dict() == {"document_index": 0, "sample_index": 0, "shuffle_index": 0, "blend_index": 0}
    assert isinstance(second[0].indices.document_index, np.memmap)
    np.testing.assert_array_equal(first[0].indices.sample_index, second[0].indices.sample_index)


def test_default_directory_is_beside_the_data(positional_dataset):
    prefix = positional_dataset(LENGTHS[:500])
    build_split_indices(config(prefix, None), (100, None, None))
    assert len(cache_entries(os.path.join(os.path.dirname(prefix), DEFAULT_CACHE_DIRNAME))) == 2


@pytest.mark.parametrize(
    "options",
    [{"add_extra_token": False}, {"drop_last_partial_validation_sequence": False}, {"random_seed": 6},
     {"separate_final_epoch_threshold": 0.5}],
)
def test_every_option_that_changes_the_arrays_changes_the_key(positional_dataset, tmp_path, options):
    prefix = positional_dataset(LENGTHS[:500])
    build_split_indices(config(prefix, str(tmp_path)), (100, 10, None))
    before = set(cache_entries(tmp_path))
    build_split_indices(config(prefix, str(tmp_path), **options), (100, 10, None))
    assert len(set(cache_entries(tmp_path)) - before) >= 1


def test_rewritten_data_files_change_the_key(positional_dataset, tmp_path):
    prefix = positional_dataset(LENGTHS[:500])
    build_split_indices(config(prefix, str(tmp_path)), (100, None, None))
    positional_dataset(LENGTHS[:400])  # same prefix, other contents
    build_split_indices(config(prefix, str(tmp_path)), (100, None, None))
    assert len(cache_entries(tmp_path)) == 4


def test_damaged_entry_is_rebuilt(positional_dataset, tmp_path):
    prefix = positional_dataset(LENGTHS[:500])
    expected = np.array(build_split_indices(config(prefix, str(tmp_path)), (100, None, None))[0].indices.sample_index)
    victim = next(name for name in os.listdir(tmp_path) if name.startswith(os.path.basename(prefix) + "-train") and "sample_index" in name)
    with open(tmp_path / victim, "wb") as f:
        f.write(b"garbage")
    rebuilt = build_split_indices(config(prefix, str(tmp_path)), (100, None, None))[0]
    np.testing.assert_array_equal(rebuilt.indices.sample_index, expected)


def test_unwritable_directory_keeps_indices_in_memory(positional_dataset, tmp_path):
    prefix = positional_dataset(LENGTHS[:500])
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    splits = build_split_indices(config(prefix, str(blocker / "cache")), (100, None, None))
    assert len(splits[0]) >= 100 and not isinstance(splits[0].indices.sample_index, np.memmap)


def test_nothing_is_cached_without_a_directory():
    cache = IndexCache(None)
    arrays = cache.load_or_build("x", {"k": 1}, ("a",), lambda: {"a": np.arange(3)})
    assert arrays["a"].tolist() == [0, 1, 2] and cache.load("x", {"k": 1}, ("a",)) is None


def _build_in_process(prefix: str, directory: str, barrier, results) -> None:
    barrier.wait()  # start together so the builds overlap
    splits = build_split_indices(config(prefix, directory), SIZES)
    digest = hashlib.sha256()
    for split in splits[:2]:
        for kind in ("document_index", "sample_index", "shuffle_index"):
            array = np.asarray(getattr(split.indices, kind))
            digest.update(array.dtype.str.encode() + array.tobytes())
    results.put(digest.hexdigest())


@pytest.mark.timeout(120)
def test_four_processes_building_one_cache_at_once_agree(positional_dataset, tmp_path):
    prefix = positional_dataset(LENGTHS)
    directory = str(tmp_path / "shared-cache")
    context = multiprocessing.get_context("spawn")
    barrier, results = context.Barrier(4), context.Queue()
    processes = [context.Process(target=_build_in_process, args=(prefix, directory, barrier, results)) for _ in range(4)]
    for process in processes:
        process.start()
    digests = [results.get(timeout=100) for _ in processes]
    for process in processes:
        process.join(timeout=30)
        assert process.exitcode == 0
    assert len(set(digests)) == 1
    assert not [name for name in os.listdir(directory) if ".tmp-" in name]
    # What they left is complete and equals a fresh in-memory build.
    fresh = build_split_indices(config(prefix, str(tmp_path / "fresh")), SIZES)
    cached = build_split_indices(config(prefix, directory), SIZES)
    for ours, theirs in zip(fresh[:2], cached[:2]):
        np.testing.assert_array_equal(ours.indices.shuffle_index, theirs.indices.shuffle_index)
