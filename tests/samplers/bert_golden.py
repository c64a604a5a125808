"""The BERT golden samples: a small synthetic sentence-split WordPiece corpus, and the script that had
megatron-core 0.16.1 sample it into ``data_test/bert/megatron_bert_samples.npz``.

    pip install --no-deps --target /tmp/mcore megatron-core==0.16.1      # its compiled helpers come in the wheel
    PYTHONPATH=/tmp/mcore:. python tests/samplers/bert_golden.py         # rewrites the .npz

The test (`test_bert_dataset.py`) writes the same corpus with `write_bert_corpus` and compares our
samples with the recorded ones; it does not need megatron-core.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import numpy as np

from indexed_dataset import IndexedDatasetWriter

ROOT = Path(__file__).resolve().parents[2]
VOCAB_FILE = ROOT / "data_test" / "tokenizers" / "wordpiece-vocab.txt"
GOLDEN_FILE = ROOT / "data_test" / "bert" / "megatron_bert_samples.npz"
SEQUENCE_LENGTH, SPLIT, SEED, SHORT_SEQ_PROB, MASK_PROB = 32, "80,20,0", 1234, 0.1, 0.15
SIZES = (60, 12, None)
# First id drawn for corpus tokens: the five special pieces come before it.
FIRST_WORD_ID = 5
# (binary head) configurations recorded.
BINARY_HEADS = (True, False)
ITEM_KEYS = ("text", "types", "labels", "is_random", "padding_mask", "loss_mask", "truncated")


def vocabulary() -> list[str]:
    """The WordPiece pieces of the test vocabulary, by id."""
    return VOCAB_FILE.read_text(encoding="utf-8").splitlines()


def write_bert_corpus(prefix: Path) -> str:
    """40 documents of 1 to 6 sentences of 2 to 20 WordPiece ids (about 40% ``##`` pieces), uint16."""
    rng = np.random.RandomState(0)
    counts = rng.randint(1, 7, size=40)
    lengths = rng.randint(2, 21, size=int(counts.sum()))
    tokens = rng.randint(FIRST_WORD_ID, len(vocabulary()), size=int(lengths.sum())).astype(np.uint16)
    with IndexedDatasetWriter(str(prefix), np.uint16) as writer:
        writer.add_documents(tokens, lengths, counts)
    return str(prefix)


class _MegatronWordPiece:
    """What megatron-core's BERT dataset reads of Megatron's BertWordPieceLowerCase: its special ids and its
    inverse vocabulary, with the [BOS]/[EOS] pieces that tokenizer appends."""

    def __init__(self) -> None:
        pieces = vocabulary() + ["[BOS]", "[EOS]"]
        self.inv_vocab = dict(enumerate(pieces))
        ids = {piece: i for i, piece in self.inv_vocab.items()}
        self.cls, self.sep, self.mask, self.pad = ids["[CLS]"], ids["[SEP]"], ids["[MASK]"], ids["[PAD]"]
        self.eos, self.eod = ids["[EOS]"], ids["[SEP]"]
        # megatron-core hashes the tokenizer's identifiers into its cache key.
        self.unique_identifiers = {"class": "BertWordPieceLowerCase", "vocab_file": VOCAB_FILE.name}


def record() -> None:
    """Sample the corpus with megatron-core and write GOLDEN_FILE."""
    import torch.distributed as dist
    from megatron.core.datasets.bert_dataset import BERTMaskedWordPieceDataset, BERTMaskedWordPieceDatasetConfig
    from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder

    dist.init_process_group("gloo", init_method=f"file://{tempfile.mktemp()}", rank=0, world_size=1)
    arrays = {}
    with tempfile.TemporaryDirectory() as directory:
        prefix = write_bert_corpus(Path(directory) / "corpus")
        for binary_head in BINARY_HEADS:
            config = BERTMaskedWordPieceDatasetConfig(
                random_seed=SEED, sequence_length=SEQUENCE_LENGTH, blend=([prefix], None), split=SPLIT,
                path_to_cache=str(Path(directory) / f"cache-{binary_head}"), tokenizer=_MegatronWordPiece(),
                masking_probability=MASK_PROB, short_sequence_probability=SHORT_SEQ_PROB, masking_max_ngram=3,
                masking_do_full_word=True, masking_do_permutation=False, masking_use_longer_ngrams=False,
                masking_use_geometric_distribution=False, classification_head=binary_head)
            datasets = BlendedMegatronDatasetBuilder(BERTMaskedWordPieceDataset, list(SIZES), lambda: True,
                                                     config).build()
            for split, dataset in zip(("train", "valid"), datasets):
                key = f"{'binary' if binary_head else 'mlm'}-{split}"
                arrays[f"{key}-sample_index"] = np.asarray(dataset.sample_index)
                items = [dataset[i] for i in range(len(dataset))]
                for name in ITEM_KEYS:
                    arrays[f"{key}-{name}"] = np.stack([np.asarray(item[name]) for item in items])
    GOLDEN_FILE.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(GOLDEN_FILE, **arrays)
    dist.destroy_process_group()


if __name__ == "__main__":
    record()
    sys.exit(0)
