"""Megatron's mock GPT data (``--mock-data``, issue 29) in the samplers: the same samples as megatron-core.

Promised:

- `MockTokenSource` holds megatron-core's `MockGPTLowLevelDataset` documents: 100000 of lengths in [1, 4095]
  drawn with seed 0, document d = ``1, 2, ..., n - 1`` modulo the vocabulary, then the EOD id;
- `build_gpt_datasets` of a ``mock`` config gives train, valid and test items (tokens, labels, loss mask,
  position ids; plain and with the document flags) equal to megatron-core 0.16.1's `MockGPTDataset` items, and
  splits of the same lengths: the golden arrays of tests/samplers/make_mock_gpt_golden.py in
  data_test/samplers/megatron_mock_gpt.npz. Megatron splits mock data 1,1,1 whatever split it was given;
- the index arrays stay in memory unless a cache directory is named, and then are cached there;
- a mock config with a blend, another split, or without the vocabulary size or EOD id is refused.
"""

from __future__ import annotations

import numpy as np
import pytest
from make_mock_gpt_golden import (
    CASES, EOD_ID, FLAGS, ITEM_KEYS, NUM_ITEMS, SEED, SIZES, SPLITS, VOCAB_SIZE,
)

from samplers import GPTDatasetConfig, build_gpt_datasets
from samplers.mock import MOCK_NUM_DOCUMENTS, MOCK_SPLIT, MockTokenSource


@pytest.fixture(scope="module")
def golden(data_test) -> dict[str, np.ndarray]:
    with np.load(data_test / "samplers" / "megatron_mock_gpt.npz") as arrays:
        return dict(arrays)


def mock_config(case: str, **options) -> GPTDatasetConfig:
    sequence_length, flags = CASES[case]
    return GPTDatasetConfig(sequence_length=sequence_length, random_seed=SEED, mock=True, vocab_size=VOCAB_SIZE,
                            eod_id=EOD_ID, **{flag: flag in flags for flag in FLAGS}, **options)


def test_the_documents_are_megatrons():
    source = MockTokenSource(vocab_size=VOCAB_SIZE, eod_id=EOD_ID)
    assert len(source) == MOCK_NUM_DOCUMENTS and source.num_documents == MOCK_NUM_DOCUMENTS
    lengths = np.random.default_rng(seed=0).integers(low=1, high=4096, size=MOCK_NUM_DOCUMENTS, dtype=np.int32)
    assert np.array_equal(source.sequence_lengths, lengths) and source.sequence_lengths.dtype == np.int32
    for document in (0, 1, int(np.argmax(lengths)), int(np.argmin(lengths))):
        n = int(lengths[document])
        whole = np.concatenate([(np.arange(n - 1) + 1) % VOCAB_SIZE, [EOD_ID]])
        assert np.array_equal(source.get(document), whole)
        assert np.array_equal(source.get(document, offset=n // 2), whole[n // 2:])
        assert np.array_equal(source.get(document, offset=n // 3, length=n // 4), whole[n // 3: n // 3 + n // 4])
    with pytest.raises(IndexError, match="document 100000"):
        source.get(MOCK_NUM_DOCUMENTS)
    with pytest.raises(IndexError, match="outside document 0"):
        source.get(0, offset=1, length=int(lengths[0]))


@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", list(CASES))
def test_samples_equal_megatron_cores_mock_gpt_dataset(case, golden):
    assert str(golden["split"]) == MOCK_SPLIT
    datasets = build_gpt_datasets(mock_config(case), sizes=SIZES)
    for split, dataset in zip(SPLITS, datasets):
        key = f"{case}.{split}"
        assert len(dataset) == int(golden[f"{key}.length"]), split
        ids = golden[f"{key}.ids"]
        assert list(ids[:NUM_ITEMS]) == list(range(NUM_ITEMS))
        items = [dataset[int(i)] for i in ids]
        for name in ITEM_KEYS:
            ours = np.stack([item[name].numpy() for item in items])
            assert ours.dtype == golden[f"{key}.{name}"].dtype, (split, name)
            assert np.array_equal(ours, golden[f"{key}.{name}"]), (split, name)


@pytest.mark.timeout(300)
def test_indices_are_cached_only_where_asked(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    case = "seq64"
    build_gpt_datasets(mock_config(case), sizes=(SIZES[0], 0, 0))
    assert list(tmp_path.iterdir()) == []
    cache = tmp_path / "cache"
    train, _, _ = build_gpt_datasets(mock_config(case, path_to_cache=str(cache)), sizes=(SIZES[0], 0, 0))
    names = sorted(path.name for path in cache.iterdir())
    assert names and all(name.startswith("mock-data-") for name in names)
    again, _, _ = build_gpt_datasets(mock_config(case, path_to_cache=str(cache)), sizes=(SIZES[0], 0, 0))
    assert sorted(path.name for path in cache.iterdir()) == names
    assert np.array_equal(again[3]["tokens"].numpy(), train[3]["tokens"].numpy())


@pytest.mark.parametrize("options, words", [
    ({"blend": (["data/x"], None), "split": "1,1,1"}, "excludes blend"),
    ({"split": "969,30,1"}, "split 1,1,1"),
    ({"vocab_size": None}, "needs vocab_size and eod_id"),
    ({"eod_id": None}, "needs vocab_size and eod_id"),
    ({"mock": False, "blend": (["data/x"], None), "split": "1,1,1"}, "mock data only"),
])
def test_malformed_mock_configs_are_refused(options, words):
    settings = {"sequence_length": 8, "mock": True, "vocab_size": VOCAB_SIZE, "eod_id": EOD_ID, **options}
    with pytest.raises(ValueError, match=words):
        GPTDatasetConfig(**settings)
