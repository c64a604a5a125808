"""GPT's samples in a training run: the samplers room's GPT datasets over the data blend, and micro-batches
of them."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from samplers import GPTDatasetConfig, build_gpt_datasets
from trainer.config import DOCUMENT_FIELDS, DataConfig
from trainer.data.batches import (IGNORE_INDEX, Vocabulary, check_data_files, check_token_ids, stack_sample_ids,
                                   to_device)
from trainer.errors import TrainConfigError


@dataclass(slots=True)
class GPTMicroBatch:
    """One micro-batch: tokens, position_ids and loss targets, each int64 [micro_batch_size, seq]."""

    tokens: torch.Tensor
    position_ids: torch.Tensor
    targets: torch.Tensor
    """Labels with IGNORE_INDEX where the loss mask is 0."""
    sample_ids: torch.Tensor | None = None
    """int64 [micro_batch_size]: the samples' ids in the run's global order (`trainer.data.batches.stack_sample_ids`)."""
    attention_mask: torch.Tensor | None = None
    """--reset-attention-mask: bool [micro_batch_size, 1, seq, seq], True = masked (Megatron's convention): each
    token sees the earlier tokens of its own document only; None: plain causal attention."""

    def to(self, device: torch.device) -> GPTMicroBatch:
        return GPTMicroBatch(*(t if t is None else to_device(t, device)
                               for t in (self.tokens, self.position_ids, self.targets, self.sample_ids,
                                         self.attention_mask)))


def build_datasets(data: DataConfig, seq_length: int, vocabulary: Vocabulary, sizes: tuple[int, int, int]):
    """The train, valid and test datasets (each None when empty and not asked for).

    Args:
        data: data settings.
        seq_length: tokens per sample.
        vocabulary: EOD and pad ids.
        sizes: samples wanted per split.

    Raises:
        TrainConfigError: a prefix has no ``.bin``/``.idx``, the split/blend is malformed, or a document flag
            (reset_position_ids, reset_attention_mask, eod_mask_loss) or mock_data is given without a tokenizer's
            EOD id.
    """
    check_data_files(data)
    documents = {name: getattr(data, name) for name in DOCUMENT_FIELDS}
    if data.mock_data and vocabulary.eod_id is None:
        raise TrainConfigError("mock_data needs the tokenizer's end-of-document id, which ends every mock "
                               "document: give tokenizer_type NullTokenizer with vocab_size, or the tokenizer "
                               "files (vocab_file and merge_file, or tokenizer_model)")
    given = [name for name, value in documents.items() if value]
    if given and vocabulary.eod_id is None:
        raise TrainConfigError(f"{', '.join(given)} need{'s' if len(given) == 1 else ''} the tokenizer's end-of-document "
                               "id: give the tokenizer files (vocab_file, merge_file or tokenizer_model)")
    options = {"pad_id": vocabulary.pad_id} if vocabulary.pad_id is not None else {}
    if data.mock_data:  # Megatron's MockGPTDataset: its documents count modulo the tokenizer's vocabulary
        options.update(mock=True, vocab_size=vocabulary.size)
    # Per-split data paths: each split's blend used whole (no split string), as build-indices does.
    elif data.blend_per_split is not None:
        options["blend_per_split"] = data.blend_per_split
    else:
        options.update(blend=data.blend, split=data.split)
    try:
        config = GPTDatasetConfig(sequence_length=seq_length, random_seed=data.seed,
                                  path_to_cache=data.data_cache_path, eod_id=vocabulary.eod_id,
                                  mmap_bin_files=not data.no_mmap_bin_files, **documents, **options)
    except ValueError as error:
        raise TrainConfigError(str(error)) from error
    return build_gpt_datasets(config, sizes=sizes)


def collate(items: list[dict[str, torch.Tensor]], vocab_size: int) -> GPTMicroBatch:
    """Stack samplers' items into a `GPTMicroBatch`.

    Raises:
        TrainConfigError: a token id does not fit the model's vocabulary.
    """
    tokens = torch.stack([item["tokens"] for item in items]).long()
    labels = torch.stack([item["labels"] for item in items]).long()
    loss_mask = torch.stack([item["loss_mask"] for item in items])
    check_token_ids(vocab_size, tokens, labels)
    targets = labels.masked_fill(loss_mask == 0, IGNORE_INDEX)
    position_ids = torch.stack([item["position_ids"] for item in items]).long()
    attention_mask = torch.stack([item["attention_mask"] for item in items]) if "attention_mask" in items[0] else None
    return GPTMicroBatch(tokens=tokens, position_ids=position_ids, targets=targets, sample_ids=stack_sample_ids(items),
                         attention_mask=attention_mask)
