"""Prompts split over the data-parallel replicas of a generation run, and every replica's results gathered.

Replica r takes prompts r, r + dp, r + 2 dp, ... in batches of ``batch_size``; each batch runs on the
replica's own tensor/pipeline ranks, so replicas never wait on one another until the final gather.
"""

from __future__ import annotations

from collections.abc import Callable

import torch.distributed as dist
from torch.distributed import ProcessGroup


def generate_over_replicas(num_prompts: int, batch_size: int, dp_rank: int, dp: int, dp_group: ProcessGroup | None,
                           run_batch: Callable[[list[int]], list[list[int]]]) -> dict[int, list[int]]:
    """Run this replica's share of the prompts and return every prompt's generated ids.

    Args:
        num_prompts: prompts of the whole run.
        batch_size: prompts per ``run_batch`` call.
        dp_rank, dp: this replica's index and the number of replicas.
        dp_group: the data-parallel group (None with one replica).
        run_batch: prompt indices -> their generated ids, in order (collective over the replica's ranks).

    Returns:
        Generated ids by prompt index, for every prompt, on every rank.
    """
    mine = list(range(dp_rank, num_prompts, dp))
    results: dict[int, list[int]] = {}
    for start in range(0, len(mine), batch_size):
        batch = mine[start:start + batch_size]
        results |= dict(zip(batch, run_batch(batch), strict=True))
    if dp_group is not None:
        gathered: list[dict[int, list[int]]] = [{} for _ in range(dp)]
        dist.all_gather_object(gathered, results, group=dp_group)
        results = {index: ids for part in gathered for index, ids in part.items()}
    return results
