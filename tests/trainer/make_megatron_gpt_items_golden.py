"""The GPT sample golden arrays for Megatron's --reset-position-ids, --reset-attention-mask and --eod-mask-loss:
megatron-core's own `GPTDataset` items over the bundled GPT-2 token file, written to
``data_test/trainer/megatron_gpt_items.npz``.

    python3 -m venv /tmp/mcore && /tmp/mcore/bin/pip install torch megatron-core==0.16.1 numpy
    /tmp/mcore/bin/python tests/trainer/make_megatron_gpt_items_golden.py     # rewrites the .npz

For each flag set (`CASES`) the first `NUM_ITEMS` items of the train split of
``data_test/megatron/sample_en_eod_text_document`` (seed `SEED`, `SEQ_LENGTH` tokens, split `SPLIT`), the way
Megatron-LM's pretrain_gpt.py builds them (`create_attention_mask` on, its default): ``<case>.tokens``,
``.labels``, ``.loss_mask``, ``.position_ids`` and ``.attention_mask`` (bool [N, 1, L, L], True = masked, as
megatron-core returns it). The test (`test_megatron_flags_data.py`) needs only numpy and the .npz.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
GOLDEN_FILE = ROOT / "data_test" / "trainer" / "megatron_gpt_items.npz"
PREFIX = ROOT / "data_test" / "megatron" / "sample_en_eod_text_document"
# GPT-2's <|endoftext|>, which preprocess-data --append-eod wrote after every document.
EOD_ID = 50256
SEED = 1234
SEQ_LENGTH = 256
SPLIT = "98,1,1"
NUM_ITEMS = 8
FLAGS = ("reset_position_ids", "reset_attention_mask", "eod_mask_loss")
CASES = {
    "plain": (),
    "reset_position_ids": ("reset_position_ids",),
    "reset_attention_mask": ("reset_attention_mask",),
    "eod_mask_loss": ("eod_mask_loss",),
    "all": FLAGS,
}


class _Tokenizer:
    """What GPTDataset reads of a tokenizer: the EOD id (no pad id: Megatron then pads with -1)."""

    eod = EOD_ID
    vocab_size = EOD_ID + 1
    # Part of the datasets' cache key (megatron_dataset.py serialises it).
    unique_identifiers = {"class": "GPT2BPETokenizer", "eod": EOD_ID}


def items(flags: tuple[str, ...], cache: str) -> dict[str, np.ndarray]:
    # Imported here: the test reads this module's constants without megatron-core installed.
    from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig

    config = GPTDatasetConfig(random_seed=SEED, sequence_length=SEQ_LENGTH, blend=([str(PREFIX)], None),
                              split=SPLIT, path_to_cache=cache, tokenizer=_Tokenizer(),
                              **{flag: flag in flags for flag in FLAGS})
    train, _, _ = BlendedMegatronDatasetBuilder(GPTDataset, [NUM_ITEMS, None, None], lambda: True, config).build()
    samples = [train[i] for i in range(NUM_ITEMS)]
    return {key: np.stack([sample[key].numpy() for sample in samples])
            for key in ("tokens", "labels", "loss_mask", "position_ids", "attention_mask")}


def main() -> int:
    arrays = {}
    with tempfile.TemporaryDirectory() as cache:
        for name, flags in CASES.items():
            arrays |= {f"{name}.{key}": value for key, value in items(flags, cache).items()}
    temporary = GOLDEN_FILE.with_suffix(".tmp.npz")
    np.savez_compressed(temporary, **arrays)
    temporary.replace(GOLDEN_FILE)
    return 0


if __name__ == "__main__":
    sys.exit(main())
