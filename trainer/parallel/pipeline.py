"""Pipeline parallelism for any model family: stage assignment, a `torch.distributed.pipelining` schedule
and the tied-embedding group (the split of a model into stages is its family's, e.g.
`trainer.models.gpt.pipeline.split_stage`).

Stages are assigned loop-style (rank r holds stages r, r + pp, r + 2 pp, ...), which is what the
interleaved schedule requires and reduces to one stage per rank otherwise.

When a model's output head is tied to its token embedding, the first and last stage each hold a
copy; `tied_embedding_group` gives the process group that sums their gradients after backward (what
Megatron does), so both copies receive identical updates.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed._functional_collectives import AsyncCollectiveTensor
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B

SCHEDULES = {"1f1b": Schedule1F1B, "gpipe": ScheduleGPipe, "interleaved": ScheduleInterleaved1F1B}


def settled(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` itself, its pending asynchronous collective, if any, finished.

    Under tensor parallelism a layer's output redistribution (e.g. an embedding's reduce-scatter onto
    sequence shards) is an `AsyncCollectiveTensor`, waited on its first use. A stage output that the stage
    only passes on is never "used": the schedule sends its memory directly, and the work stays registered,
    which torch reports at exit as an unwaited collective call. The same tensor is returned (not the waited
    copy ``trigger_wait`` gives, which has left the autograd graph), so its gradient still flows back.
    """
    if isinstance(tensor, AsyncCollectiveTensor):
        tensor.trigger_wait()
    return tensor


def stage_ids_of_rank(pp_rank: int, pp: int, chunks_per_rank: int) -> list[int]:
    """Stage indices held by ``pp_rank`` (loop-style assignment)."""
    return [pp_rank + k * pp for k in range(chunks_per_rank)]


def build_schedule(stage_modules: list[nn.Module], stage_ids: list[int], num_stages: int, pp_mesh: DeviceMesh,
                   device: torch.device, num_microbatches: int, schedule_name: str,
                   loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]):
    """The pipeline schedule that runs this rank's stages.

    The gradients it leaves are summed over the micro-batches: the caller divides them by
    ``num_microbatches`` (`trainer.optim.grads.divide_grads`) so that a mean-reduced ``loss_fn`` gives the
    gradient of the whole local batch, as without pipelining. (The schedule's own ``scale_grads`` divides each
    DTensor gradient in place, which torch 2.10 refuses for a pending sum: the sequence-parallel norms'.)
    """
    group = pp_mesh.get_group()
    stages = [PipelineStage(module, stage_id, num_stages, device, group=group)
              for module, stage_id in zip(stage_modules, stage_ids)]
    schedule_cls = SCHEDULES[schedule_name]
    options = dict(n_microbatches=num_microbatches, loss_fn=loss_fn, scale_grads=False)
    return schedule_cls(stages if schedule_name == "interleaved" else stages[0], **options)


def tied_embedding_group(mesh: DeviceMesh) -> dist.ProcessGroup | None:
    """The group {first pp stage, last pp stage} at this rank's (dp, tp) position; None if pp = 1.

    Every rank creates every such group, in the same order, as ``new_group`` requires.
    """
    ranks = mesh.mesh  # [pp, dp, tp] global ranks
    if ranks.shape[0] == 1:
        return None
    mine = None
    for dp_index in range(ranks.shape[1]):
        for tp_index in range(ranks.shape[2]):
            members = [int(ranks[0, dp_index, tp_index]), int(ranks[-1, dp_index, tp_index])]
            group = dist.new_group(members)
            if dist.get_rank() in members:
                mine = group
    return mine
