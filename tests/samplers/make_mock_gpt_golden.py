"""The golden samples of Megatron's ``--mock-data``: megatron-core's own `MockGPTDataset` train, valid and test
items, written to ``data_test/samplers/megatron_mock_gpt.npz``.

    python3 -m venv /tmp/mcore && /tmp/mcore/bin/pip install torch megatron-core==0.16.1 numpy
    /tmp/mcore/bin/python tests/samplers/make_mock_gpt_golden.py      # rewrites the .npz

Megatron-LM's pretrain_gpt.py, given ``--mock-data`` (and no data path), builds its `GPTDatasetConfig` with
``blend=None``: the config then sets ``mock`` and replaces any ``split`` with "1,1,1", and
`BlendedMegatronDatasetBuilder` builds `MockGPTDataset` over `MockGPTLowLevelDataset` (100000 documents of
seeded random lengths, tokens 1, 2, ... modulo the vocabulary, then the EOD). This script does the same,
passing the split `SPLIT` to show that it is replaced, with a tokenizer stub that reads as Megatron's
``--tokenizer-type NullTokenizer --vocab-size VOCAB_SIZE`` (megatron/core/tokenizers/text/libraries/
null_tokenizer.py at Megatron-LM HEAD: ``vocab_size`` ids, EOD ``vocab_size - 1``, no pad).

For each case of `CASES` (sequence length, document flags) and each split, the items listed in ``<case>.
<split>.ids`` (the first `NUM_ITEMS` and the split's last): ``<case>.<split>.tokens``, ``.labels``,
``.loss_mask`` and ``.position_ids``, and the split's length ``<case>.<split>.length``; ``split``: the split
megatron-core used. The test (`test_mock_gpt_dataset.py`) needs only numpy and the .npz.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
GOLDEN_FILE = ROOT / "data_test" / "samplers" / "megatron_mock_gpt.npz"
SEED = 1234
# Below the longest mock document (4095 tokens), so the token values wrap around the vocabulary.
VOCAB_SIZE = 1000
EOD_ID = VOCAB_SIZE - 1
SPLIT = "969,30,1"
# Samples asked of train, valid and test (train-iters x global batch etc. in a run).
SIZES = (48, 24, 8)
NUM_ITEMS = 16
SPLITS = ("train", "valid", "test")
ITEM_KEYS = ("tokens", "labels", "loss_mask", "position_ids")
FLAGS = ("reset_position_ids", "reset_attention_mask", "eod_mask_loss")
CASES = {
    "seq64": (64, ()),
    "seq33_documents": (33, ("reset_position_ids", "eod_mask_loss")),
}


class _NullTokenizer:
    """What the mock datasets read of a tokenizer: the vocabulary size and the EOD id (no pad id: -1 pads)."""

    vocab_size = VOCAB_SIZE
    eod = EOD_ID
    # Part of the datasets' description (megatron_dataset.py serialises it).
    unique_identifiers = {"class": "NullTokenizer", "vocab_size": VOCAB_SIZE, "eod": EOD_ID}


def case_arrays(name: str) -> dict[str, np.ndarray]:
    # Imported here: the test reads this module's constants without megatron-core installed.
    from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
    from megatron.core.datasets.gpt_dataset import GPTDatasetConfig, MockGPTDataset

    sequence_length, flags = CASES[name]
    config = GPTDatasetConfig(random_seed=SEED, sequence_length=sequence_length, blend=None, blend_per_split=None,
                              split=SPLIT, path_to_cache=None, tokenizer=_NullTokenizer(),
                              **{flag: flag in flags for flag in FLAGS})
    assert config.mock
    datasets = BlendedMegatronDatasetBuilder(MockGPTDataset, list(SIZES), lambda: True, config).build()
    arrays: dict[str, np.ndarray] = {"split": np.array(config.split)}
    for split, dataset in zip(SPLITS, datasets):
        ids = [*range(NUM_ITEMS), len(dataset) - 1]
        items = [dataset[i] for i in ids]
        arrays[f"{name}.{split}.ids"] = np.array(ids, dtype=np.int64)
        arrays[f"{name}.{split}.length"] = np.array(len(dataset), dtype=np.int64)
        for key in ITEM_KEYS:
            arrays[f"{name}.{split}.{key}"] = np.stack([item[key].numpy() for item in items])
    return arrays


def main() -> int:
    arrays: dict[str, np.ndarray] = {}
    for name in CASES:
        arrays |= case_arrays(name)
    GOLDEN_FILE.parent.mkdir(parents=True, exist_ok=True)
    temporary = GOLDEN_FILE.with_suffix(".tmp.npz")
    np.savez_compressed(temporary, **arrays)
    temporary.replace(GOLDEN_FILE)
    return 0


if __name__ == "__main__":
    sys.exit(main())
