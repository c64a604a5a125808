"""Items (prompts, rows to score) split over the data-parallel replicas of a run, and every replica's results
gathered.

Replica r takes items r, r + dp, r + 2 dp, ... in batches of ``batch_size``; each batch runs on the
replica's own tensor/pipeline ranks, so replicas never wait on one another until the final gather.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import torch.distributed as dist
from torch.distributed import ProcessGroup
from tqdm import tqdm

T = TypeVar("T")


def map_over_replicas(count: int, batch_size: int, dp_rank: int, dp: int, dp_group: ProcessGroup | None,
                      run_batch: Callable[[list[int]], list[T]], progress: str | None = None,
                      lockstep: bool = False) -> list[T]:
    """Run this replica's share of items ``0..count-1`` and return every item's result (collective over
    every process of the run).

    Args:
        count: items of the whole run.
        batch_size: items per ``run_batch`` call.
        dp_rank, dp: this replica's index and the number of replicas.
        dp_group: the data-parallel group (None with one replica).
        run_batch: item indices -> one result each, in order (collective over the replica's ranks).
        progress: the label of a progress bar over this replica's batches (stderr); None: no bar.
        lockstep: every replica runs the same number of batches of the same sizes (replicas whose forward
            passes are collective with one another: experts sharded over them, `trainer.generation.layout`):
            the items are rounded up to a multiple of dp with fillers, which run item 0 again and whose
            results are dropped.

    Returns:
        Every item's result, in item order, on every rank.
    """
    padded = -(-count // dp) * dp if lockstep else count
    mine = list(range(dp_rank, padded, dp))
    results: dict[int, T] = {}
    starts = range(0, len(mine), batch_size)
    for start in tqdm(starts, desc=progress, unit="batch", disable=progress is None, dynamic_ncols=True):
        batch = mine[start:start + batch_size]
        ran = run_batch([index if index < count else 0 for index in batch])
        results |= {index: result for index, result in zip(batch, ran, strict=True) if index < count}
    if dp_group is not None:
        gathered: list[dict[int, T]] = [{} for _ in range(dp)]
        dist.all_gather_object(gathered, results, group=dp_group)
        results = {index: result for part in gathered for index, result in part.items()}
    return [results[index] for index in range(count)]
