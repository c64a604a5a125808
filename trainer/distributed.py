"""Process-group setup and the elastic launcher behind ``train --num-gpus-per-node N``.

`init_distributed` joins the process group a launcher describes in the environment (torchrun, our
own `launch`, or a group the caller already initialised) and otherwise runs as one plain process.
`launch` starts ``nproc_per_node`` workers through torch's elastic agent, which is what torchrun
does, with a static rendezvous at ``master_addr:master_port``.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.launcher.api import LaunchConfig as ElasticLaunchConfig
from torch.distributed.launcher.api import elastic_launch

from trainer.config import LaunchConfig
from trainer.errors import TrainConfigError

logger = logging.getLogger(__name__)

# Seconds a node waits for the others at the rendezvous before failing (torchrun's default is 900).
RENDEZVOUS_TIMEOUT_S = 300


@dataclass(frozen=True, slots=True)
class DistContext:
    """Where this process stands."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    owns_process_group: bool
    """True when `init_distributed` created the group and must destroy it."""


def resolve_device_type(device: str | None) -> str:
    """``cuda`` when asked for or available, else ``cpu``.

    Raises:
        TrainConfigError: cuda was asked for but is not available.
    """
    if device == "cuda" and not torch.cuda.is_available():
        raise TrainConfigError("device cuda was asked for but no CUDA device is available")
    return device or ("cuda" if torch.cuda.is_available() else "cpu")


def init_distributed(device_type: str) -> DistContext:
    """Join the launcher's process group (gloo on CPU, NCCL on GPU), or run as one process."""
    owns = False
    if not dist.is_initialized() and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        dist.init_process_group(backend="nccl" if device_type == "cuda" else "gloo")
        owns = True
    rank = dist.get_rank() if dist.is_initialized() else 0
    world_size = dist.get_world_size() if dist.is_initialized() else 1
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if device_type == "cuda":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    return DistContext(rank=rank, world_size=world_size, local_rank=local_rank, device=device,
                       owns_process_group=owns)


def under_launcher() -> bool:
    """True inside torchrun/elastic workers (or an initialised group): do not launch again."""
    return dist.is_initialized() or "TORCHELASTIC_RUN_ID" in os.environ or "LOCAL_RANK" in os.environ


def launch(config: LaunchConfig, entrypoint: Callable[..., int], *args: object) -> dict[int, int]:
    """Run ``entrypoint(*args)`` in ``num_gpus_per_node`` processes on this node.

    Returns:
        Each local rank's return value.

    Raises:
        torch.distributed.elastic.multiprocessing.errors.ChildFailedError: a worker failed.
    """
    if config.master_port == 0:
        # torchrun --standalone: a c10d store on a free local port.
        rendezvous = {"rdzv_backend": "c10d", "rdzv_endpoint": "localhost:0",
                      "rdzv_configs": {"timeout": RENDEZVOUS_TIMEOUT_S}}
    else:
        rendezvous = {"rdzv_backend": "static", "rdzv_endpoint": f"{config.master_addr}:{config.master_port}",
                      "rdzv_configs": {"rank": config.node_rank, "timeout": RENDEZVOUS_TIMEOUT_S}}
    elastic = ElasticLaunchConfig(
        min_nodes=config.num_nodes, max_nodes=config.num_nodes, nproc_per_node=config.num_gpus_per_node,
        run_id=f"tokenmill-{uuid.uuid4().hex[:8]}" if config.num_nodes == 1 else "tokenmill-train",
        max_restarts=0, start_method="spawn", **rendezvous)
    logger.info("launching %d processes on node %d of %d", config.num_gpus_per_node, config.node_rank,
                config.num_nodes)
    return elastic_launch(elastic, entrypoint)(*args)
