"""Samples interleaved from several GPT datasets by weight, as megatron-core's BlendedDataset.

    blend = BlendedDataset(blended_split, config)   # blended_split: a builder.BlendedSplit
    blend[i] == members[dataset_index[i]][dataset_sample_index[i]]
"""

from __future__ import annotations

import torch

from .builder import BlendedSplit
from .config import GPTDatasetConfig
from .gpt.dataset import GPTDataset


class BlendedDataset(torch.utils.data.Dataset):
    """A blend's split; items are the members' items (tokens, labels, loss_mask, position_ids).

    Args:
        split: the members' index arrays and the interleaving (from `builder.build_split_indices`).
        config: the sample options shared by every member.
    """

    def __init__(self, split: BlendedSplit, config: GPTDatasetConfig) -> None:
        self.split = split.split
        self.datasets = [GPTDataset(member, config) if member is not None else None for member in split.members]
        self.dataset_index = split.dataset_index
        self.dataset_sample_index = split.dataset_sample_index

    def __len__(self) -> int:
        return len(self.dataset_index)

    def locate_token(self, idx: int, token_id: int) -> str | None:
        """Where item `idx` holds `token_id`: "PATH: document D", or None (see `GPTDataset.locate_token`)."""
        return self.datasets[int(self.dataset_index[idx])].locate_token(int(self.dataset_sample_index[idx]), token_id)

    def __getitem__(self, idx: int) -> dict[str, torch.Tensor]:
        idx = int(idx)
        if not -len(self) <= idx < len(self):
            raise IndexError(f"sample {idx} out of range for a blend of {len(self)} samples")
        return self.datasets[int(self.dataset_index[idx])][int(self.dataset_sample_index[idx])]
