"""BERT masked-LM (+ sentence-order) samples over a sentence-split dataset (`preprocess-data --split-sentences`
with a WordPiece vocabulary; any format).

    config = BertDatasetConfig(data_prefix="data/x_text_sentence", split="949,50,1", sequence_length=512,
                               masking=MaskingOptions(cls_id=101, sep_id=102, mask_id=103, continuation=...,
                                                      random_token_count=30524), pad_id=0)
    train, valid, test = build_bert_datasets(config, sizes=(10000, 100, None))
    item = train[0]   # megatron-core's keys: text, types, labels, is_random, padding_mask, loss_mask, truncated

megatron-core 0.16's `BERTMaskedWordPieceDataset`, sample for sample (the tests hold samples it made):

- the sample index is helpers.cpp's `build_mapping` for ``sequence_length - 3`` tokens (room for [CLS]
  and two [SEP]) with at least 2 sentences per sample under the binary head, 1 without
  (`samplers.t5.indices.build_t5_sample_index` with ``min_sentences``);
- sample k draws from RandomState(seed + k): with the binary head, the pivot between segment A and B
  (a random sentence boundary when there are 3 or more sentences) and, with probability 1/2, A and B
  swapped (``is_random`` = 1: sentence-order prediction, as megatron-core does it);
- the pair is trimmed to the target length one token at a time, from the longer segment, at its front
  or back at random; then [CLS] A [SEP] B [SEP] with token types 0 for [CLS] A [SEP], 1 for B [SEP];
- masking is `samplers.bert.masking.mask_tokens`; labels are -1 where nothing is predicted;
- padding is the pad id; ``padding_mask`` is 1 except where a token equals the pad id (megatron-core's
  rule: a random replacement that happens to be the pad id is masked out of attention too).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from ..builder import Sizes
from ..sentences import SEED_MODULUS, SentenceSampleDataset, build_sentence_splits, sample_random_state
from ..sources import TokenSource
from ..splits import DEFAULT_SPLIT, parse_split
from ..t5.indices import build_t5_sample_index
from .masking import MaskingOptions, mask_tokens

BERT_CACHE_FORMAT = "tokenmill-bert-indices-1"
"""Part of every cache description: bump it when the sample index's meaning changes."""
RESERVED_POSITIONS = 3
"""[CLS] and two [SEP]: megatron-core builds the sample index for sequence_length - 3 tokens."""
BINARY_HEAD_MIN_SENTENCES = 2
"""Segments A and B need a sentence each."""
MIN_SEQUENCE_LENGTH = RESERVED_POSITIONS + 2
"""The sample index needs a target of at least 2 tokens (`samplers.t5.indices.MIN_TARGET_LENGTH`)."""
SWAP_PROBABILITY = 0.5
"""Sentence-order prediction swaps A and B of half the samples."""
FRONT_TRIM_PROBABILITY = 0.5
"""Trimming removes a segment's first token with this probability, else its last."""
NO_LABEL = -1
"""megatron-core's label where no token is predicted."""


@dataclass(kw_only=True, slots=True)
class BertDatasetConfig:
    """How to turn a sentence-split WordPiece dataset into BERT samples."""

    data_prefix: str
    """Dataset prefix (one sequence per sentence, documents via document_indices)."""
    masking: MaskingOptions
    """Special ids, the WordPiece continuation marks and the masking options."""
    pad_id: int
    """Padding id."""
    split: str = DEFAULT_SPLIT
    """Split fractions over documents."""
    sequence_length: int = 512
    """Positions per sample (``--seq-length``)."""
    short_seq_prob: float = 0.1
    """Probability of a shorter random target length (``--short-seq-prob``)."""
    binary_head: bool = True
    """Sentence-order samples: two segments, swapped half the time (``--bert-binary-head``)."""
    random_seed: int = 1234
    """Seed of the sample index and of every sample's segments and masking."""
    path_to_cache: Optional[str] = None
    """Index cache directory; None: `index-cache/` beside the dataset."""

    def __post_init__(self) -> None:
        if self.sequence_length < MIN_SEQUENCE_LENGTH:
            raise ValueError(f"sequence_length must be >= {MIN_SEQUENCE_LENGTH}, got {self.sequence_length}")
        if not 0 < self.masking.masking_probability < 1:
            raise ValueError(f"mask_prob must be in (0, 1), got {self.masking.masking_probability}")
        if not 0 <= self.short_seq_prob <= 1:
            raise ValueError(f"short_seq_prob must be in [0, 1], got {self.short_seq_prob}")
        parse_split(self.split)

    @property
    def min_sentences(self) -> int:
        return BINARY_HEAD_MIN_SENTENCES if self.binary_head else 1


def _segments(sentences: list[np.ndarray], binary_head: bool, rng: np.random.RandomState
              ) -> tuple[list[int], list[int], bool]:
    """Segments A and B of a sample's sentences, and whether they were swapped."""
    pivot, swapped = len(sentences), False
    if binary_head:
        pivot = 1
        if len(sentences) >= 3:
            pivot = rng.randint(low=1, high=len(sentences))
        swapped = rng.random() < SWAP_PROBABILITY
    first = [int(t) for sentence in sentences[:pivot] for t in sentence]
    second = [int(t) for sentence in sentences[pivot:] for t in sentence]
    return (second, first, True) if swapped else (first, second, False)


def _trim(first: list[int], second: list[int], target_length: int, rng: np.random.RandomState) -> bool:
    """Trim the pair in place to ``target_length`` tokens; whether anything was cut."""
    if len(first) + len(second) <= target_length:
        return False
    while len(first) + len(second) > target_length:
        segment = first if len(first) > len(second) else second
        del segment[0 if rng.random() < FRONT_TRIM_PROBABILITY else -1]
    return True


class BertDataset(SentenceSampleDataset):
    """One split of BERT samples.

    Args:
        dataset: the sentence-split dataset.
        split: "train", "valid" or "test".
        document_range: the split's [begin, end) document ids.
        sample_index: int64 [n, 3] (first sentence, end sentence, target length).
        config: the sample options.
    """

    def __getitem__(self, idx: int) -> dict[str, np.ndarray | int]:
        """Sample ``idx``: int64 [sequence_length] arrays text, types, labels, padding_mask, loss_mask; ints
        is_random and truncated (megatron-core's item)."""
        idx = range(len(self))[int(idx)]
        config = self.config
        first, end, target_length = (int(x) for x in self.sample_index[idx])
        sentences = [self.dataset.sequences(i, i + 1) for i in range(first, end)]
        rng = sample_random_state((config.random_seed + idx) % SEED_MODULUS)
        segment_a, segment_b, swapped = _segments(sentences, config.binary_head, rng)
        truncated = _trim(segment_a, segment_b, target_length, rng)
        cls, sep = config.masking.cls_id, config.masking.sep_id
        tokens = [cls, *segment_a, sep]
        types = [0] * len(tokens)
        if segment_b:
            tokens += [*segment_b, sep]
            types += [1] * (len(segment_b) + 1)
        tokens, positions, labels = mask_tokens(tokens, target_length, config.masking, rng)
        padding = config.sequence_length - len(tokens)
        text = np.pad(np.array(tokens, np.int64), (0, padding), constant_values=config.pad_id)
        label_row = np.full(config.sequence_length, NO_LABEL, np.int64)
        label_row[positions] = labels
        loss_mask = np.zeros(config.sequence_length, np.int64)
        loss_mask[positions] = 1
        padding_mask = (text != config.pad_id).astype(np.int64)
        # megatron-core maps pad ids to 0 so that the embedding can look them up (a no-op for BERT's pad 0).
        text[text == config.pad_id] = 0
        label_row[label_row == config.pad_id] = 0
        return {"text": text, "types": np.pad(np.array(types, np.int64), (0, padding), constant_values=config.pad_id),
                "labels": label_row, "is_random": int(swapped), "padding_mask": padding_mask,
                "loss_mask": loss_mask, "truncated": int(truncated)}


def bert_index_description(dataset: TokenSource, split: str, document_range: tuple[int, int],
                           num_samples: Optional[int], config: BertDatasetConfig) -> dict[str, object]:
    """Everything that determines a split's sample index (the cache key)."""
    return {
        "class": "BertDataset",
        "format": BERT_CACHE_FORMAT,
        "dataset": dataset.fingerprint(),
        "split": split,
        "document_range": list(document_range),
        "num_samples": num_samples,
        "max_seq_length": config.sequence_length - RESERVED_POSITIONS,
        "min_sentences": config.min_sentences,
        "short_seq_prob": config.short_seq_prob,
        "random_seed": config.random_seed,
    }


def build_bert_datasets(config: BertDatasetConfig, sizes: Optional[Sizes] = None
                        ) -> tuple[Optional[BertDataset], ...]:
    """The train, valid and test BERT datasets (None for an absent split), their sample indices loaded from the
    cache or built; `samplers.sentences.build_sentence_splits` says which splits, and what it raises."""

    def build_index(dataset: TokenSource, document_range: tuple[int, int], size: Optional[int]) -> np.ndarray:
        return build_t5_sample_index(dataset.document_indices, dataset.sequence_lengths, document_range, size,
                                     config.sequence_length - RESERVED_POSITIONS, config.short_seq_prob,
                                     config.random_seed, config.min_sentences)

    splits = build_sentence_splits(
        config.data_prefix, config.split, config.path_to_cache, sizes, kind="BERT", stem="bert",
        description=lambda dataset, name, document_range, size: bert_index_description(
            dataset, name, document_range, size, config),
        build_index=build_index,
        no_sample=f"BERT sample (documents of at least {config.min_sentences} sentences)")
    return tuple(None if split is None else BertDataset(split.dataset, split.name, split.document_range,
                                                        split.sample_index, config) for split in splits)
