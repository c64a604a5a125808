"""`DataParallelSampler`: micro-batches of sample ids for one data-parallel rank, resumable anywhere.

    sampler = DataParallelSampler(total_samples=len(train), consumed_samples=0, micro_batch_size=4,
                                  data_parallel_rank=rank, data_parallel_size=dp)
    loader = torch.utils.data.DataLoader(train, batch_sampler=sampler)

There is one global order of sample ids, independent of the number of ranks: `num_epochs` passes
over [0, total_samples), each pass in order (`shuffle=False`, Megatron's pretraining sampler) or in a
permutation seeded by (seed, epoch) (`shuffle=True`). Each step takes the next
`micro_batch_size * data_parallel_size` ids of that order, and rank r gets its slice
[r * micro_batch_size, (r + 1) * micro_batch_size); an incomplete last step is dropped.

The state is `(consumed_samples, seed)`: a sampler built with the same seed and any
`consumed_samples` continues the same global order, also with another data-parallel size. Iterating
does not change `consumed_samples` (a DataLoader prefetches ahead of training): the trainer counts
consumed samples (steps * global batch size) and saves them, as Megatron does.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np


class DataParallelSampler:
    """Batch sampler over a global, deterministic order of sample ids.

    Args:
        total_samples: samples in the dataset (len(dataset)).
        consumed_samples: position in the global order to start from (samples already trained on).
        micro_batch_size: ids per micro-batch and rank.
        data_parallel_rank: this rank, in [0, data_parallel_size).
        data_parallel_size: number of data-parallel ranks.
        shuffle: permute each pass (seeded by seed and the pass number) instead of reading in order.
        seed: seed of the permutations (unused without shuffle, but part of the state).
        num_epochs: passes over the dataset in the global order.

    Raises:
        ValueError: a count is out of range (the message names the argument and its value).
    """

    def __init__(
        self,
        total_samples: int,
        consumed_samples: int,
        micro_batch_size: int,
        data_parallel_rank: int,
        data_parallel_size: int,
        shuffle: bool = False,
        seed: int = 1234,
        num_epochs: int = 1,
    ) -> None:
        if total_samples <= 0:
            raise ValueError(f"total_samples must be > 0, got {total_samples}")
        if micro_batch_size <= 0:
            raise ValueError(f"micro_batch_size must be > 0, got {micro_batch_size}")
        if data_parallel_size <= 0:
            raise ValueError(f"data_parallel_size must be > 0, got {data_parallel_size}")
        if not 0 <= data_parallel_rank < data_parallel_size:
            raise ValueError(f"data_parallel_rank must be in [0, {data_parallel_size}), got {data_parallel_rank}")
        if num_epochs <= 0:
            raise ValueError(f"num_epochs must be > 0, got {num_epochs}")
        if not 0 <= consumed_samples <= total_samples * num_epochs:
            raise ValueError(
                f"consumed_samples must be in [0, {total_samples * num_epochs}] "
                f"(total_samples * num_epochs), got {consumed_samples}"
            )
        self.total_samples = total_samples
        self.consumed_samples = consumed_samples
        self.micro_batch_size = micro_batch_size
        self.data_parallel_rank = data_parallel_rank
        self.data_parallel_size = data_parallel_size
        self.shuffle = shuffle
        self.seed = seed
        self.num_epochs = num_epochs
        self._permutation_epoch = -1
        self._permutation = np.empty(0, dtype=np.int64)

    @property
    def samples_per_step(self) -> int:
        """Ids one step takes from the global order: micro_batch_size * data_parallel_size."""
        return self.micro_batch_size * self.data_parallel_size

    def epoch_order(self, epoch: int) -> np.ndarray:
        """The sample ids of pass `epoch` in order: int64 [total_samples]."""
        if not self.shuffle:
            return np.arange(self.total_samples, dtype=np.int64)
        if epoch != self._permutation_epoch:
            generator = np.random.Generator(np.random.PCG64(np.random.SeedSequence([self.seed, epoch])))
            self._permutation = generator.permutation(self.total_samples)
            self._permutation_epoch = epoch
        return self._permutation

    def global_order(self, start: int, stop: int) -> np.ndarray:
        """Sample ids at positions [start, stop) of the global order (may span passes): int64."""
        parts = []
        position = start
        while position < stop:
            epoch, offset = divmod(position, self.total_samples)
            take = min(stop - position, self.total_samples - offset)
            parts.append(self.epoch_order(epoch)[offset : offset + take])
            position += take
        return np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)

    def __len__(self) -> int:
        """Micro-batches this rank yields from `consumed_samples` on."""
        return (self.total_samples * self.num_epochs - self.consumed_samples) // self.samples_per_step

    def __iter__(self) -> Iterator[list[int]]:
        rank_start = self.data_parallel_rank * self.micro_batch_size
        for step in range(len(self)):
            start = self.consumed_samples + step * self.samples_per_step + rank_start
            yield self.global_order(start, start + self.micro_batch_size).tolist()

    def state_dict(self) -> dict[str, int]:
        """The resumable state: {"consumed_samples", "seed"}."""
        return {"consumed_samples": self.consumed_samples, "seed": self.seed}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Continue from a saved state (from any data-parallel size)."""
        if not 0 <= state["consumed_samples"] <= self.total_samples * self.num_epochs:
            raise ValueError(f"consumed_samples {state['consumed_samples']} is beyond this sampler's samples")
        self.consumed_samples = int(state["consumed_samples"])
        self.seed = int(state["seed"])
        self._permutation_epoch = -1
