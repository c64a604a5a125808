"""GPT training samples as a torch Dataset, item for item what megatron-core's GPTDataset returns.

    train = GPTDataset(split_indices, config)      # split_indices: a builder.MidLevelSplit
    item = train[0]   # tokens, labels (LongTensor [L]), loss_mask (FloatTensor [L]), position_ids (LongTensor [L])

Sample i is sample `shuffle_index[i]` of the split: L + extra consecutive tokens of the epochs' shuffled
sequences, crossing sequence boundaries freely (Megatron's packing). With the extra token, tokens are
its first L and labels its last L; without, labels are tokens shifted left with the pad id at the end.
A partial last validation sample is right-padded with the pad id, and its pad labels get loss mask 0.
"""

from __future__ import annotations

import numpy as np
import torch

from ..builder import MidLevelSplit
from ..config import GPTDatasetConfig
from .indices import locate_token, read_sample


def reset_position_ids(tokens: np.ndarray, eod_id: int) -> np.ndarray:
    """Position ids that restart at 0 after every EOD token (the EOD keeps its old position).

    Args:
        tokens: int64 [L], the input tokens.
        eod_id: end-of-document token id.

    Returns:
        int64 [L]: position k minus the index just after the last EOD before k.
    """
    positions = np.arange(len(tokens), dtype=np.int64)
    restarts = np.zeros(len(tokens), dtype=np.int64)
    after_eod = np.flatnonzero(tokens[:-1] == eod_id) + 1
    restarts[after_eod] = after_eod
    return positions - np.maximum.accumulate(restarts)


def document_attention_mask(tokens: np.ndarray, eod_id: int) -> np.ndarray:
    """Causal mask that also blocks attention to earlier documents, Megatron's convention: True = masked.

    Returns:
        bool [1, L, L].
    """
    document_ids = np.concatenate(([0], np.cumsum(tokens[:-1] == eod_id)))
    causal = np.tril(np.ones((len(tokens), len(tokens)), dtype=bool))
    same_document = document_ids[:, None] == document_ids[None, :]
    return ~(causal & same_document)[None]


class GPTDataset(torch.utils.data.Dataset):
    """One dataset's split of GPT samples.

    Args:
        split: the split's dataset and index arrays (from `builder.build_split_indices`).
        config: the sample options (extra token, pad and EOD handling).
    """

    def __init__(self, split: MidLevelSplit, config: GPTDatasetConfig) -> None:
        self.dataset = split.dataset
        self.split = split.split
        self.indices = split.indices
        self.config = config

    def __len__(self) -> int:
        return len(self.indices)

    def locate_token(self, idx: int, token_id: int) -> str | None:
        """Where item `idx` holds `token_id`: "PATH: document D", or None (to name a bad id's source)."""
        return locate_token(self.dataset, self.indices, int(idx), self.config.extra_tokens, token_id)

    def __getitem__(self, idx: int) -> dict[str, torch.Tensor]:
        config = self.config
        text = read_sample(self.dataset, self.indices, int(idx), config.sequence_length, config.extra_tokens, config.pad_id)
        if config.add_extra_token:
            tokens, labels = text[:-1].copy(), text[1:].copy()
        else:
            tokens, labels = text, np.append(text[1:], config.pad_id)
        loss_mask = np.ones(len(tokens), dtype=np.float32)
        if config.eod_mask_loss:
            loss_mask[tokens == config.eod_id] = 0.0
        if config.reset_position_ids:
            position_ids = reset_position_ids(tokens, config.eod_id)
        else:
            position_ids = np.arange(len(tokens), dtype=np.int64)
        item = {}
        if config.reset_attention_mask:
            item["attention_mask"] = torch.from_numpy(document_attention_mask(tokens, config.eod_id))
        # As Megatron: no loss on padding, and pad ids (possibly -1) mapped to 0 so embeddings accept them.
        loss_mask[labels == config.pad_id] = 0.0
        tokens[tokens == config.pad_id] = 0
        labels[labels == config.pad_id] = 0
        item.update(
            tokens=torch.from_numpy(tokens),
            labels=torch.from_numpy(labels),
            loss_mask=torch.from_numpy(loss_mask),
            position_ids=torch.from_numpy(position_ids),
        )
        return item
