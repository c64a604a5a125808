"""``--print-memory``: what one rank holds after a step, by kind, device and host apart (DeepSpeed's T5 guide
prints the same after one step with and without offload).

    report = measure_memory(params, optimizer, device)   # bytes of this rank
    reports = gather_reports(report)                     # every rank's, on every rank

Bytes are counted per tensor *storage*, each once: a view (a ZeRO-1 slice of a parameter, FSDP2's padded
shard) counts the storage it lives in, so a master weight that is a view of its parameter costs nothing
extra, while an offloaded copy on the CPU counts as optimiser state there.
"""

from __future__ import annotations

import logging
import resource
import sys
from collections.abc import Iterable
from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

logger = logging.getLogger(__name__)

# ru_maxrss is in kibibytes on Linux, in bytes on macOS.
RSS_UNIT_BYTES = 1 if sys.platform == "darwin" else 1024
MIB = 2**20


@dataclass(frozen=True, slots=True)
class MemoryReport:
    """Bytes one rank holds (``*_device``: on its accelerator, or on the CPU for a CPU run; ``*_cpu``: in host
    memory beside an accelerator, e.g. offloaded optimiser state) and its peak."""

    rank: int
    parameters_device: int
    parameters_cpu: int
    gradients_device: int
    gradients_cpu: int
    optimizer_device: int
    optimizer_cpu: int
    peak_bytes: int
    """CUDA: torch.cuda.max_memory_allocated; CPU: the process's peak resident set size."""
    peak_kind: str
    """``cuda_max_allocated`` or ``cpu_peak_rss``."""

    def model_state_bytes(self) -> int:
        """Parameters, gradients and optimiser state, device and CPU together."""
        return (self.parameters_device + self.parameters_cpu + self.gradients_device + self.gradients_cpu
                + self.optimizer_device + self.optimizer_cpu)

    def log_line(self) -> str:
        def mib(value: int) -> str:
            return f"{value / MIB:.2f}"
        return (f"memory rank {self.rank} (MiB) | parameters {mib(self.parameters_device)} device + "
                f"{mib(self.parameters_cpu)} cpu | gradients {mib(self.gradients_device)} + "
                f"{mib(self.gradients_cpu)} | optimizer states {mib(self.optimizer_device)} + "
                f"{mib(self.optimizer_cpu)} | {self.peak_kind} {mib(self.peak_bytes)}")


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


class _StorageCounter:
    """Bytes of distinct storages, split into the accelerator's and the host's."""

    def __init__(self, accelerator: bool) -> None:
        self.accelerator = accelerator
        self.seen: set[int] = set()

    def count(self, tensors: Iterable[torch.Tensor | None]) -> tuple[int, int]:
        """(device bytes, cpu bytes) of the storages of ``tensors`` not counted before."""
        device = cpu = 0
        for tensor in tensors:
            if tensor is None:
                continue
            storage = _local(tensor).untyped_storage()
            if storage.nbytes() == 0 or storage.data_ptr() in self.seen:
                continue
            self.seen.add(storage.data_ptr())
            if self.accelerator and tensor.device.type != "cpu":
                device += storage.nbytes()
            elif self.accelerator:
                cpu += storage.nbytes()
            else:
                device += storage.nbytes()
        return device, cpu


def _optimizer_tensors(optimizer) -> tuple[list[torch.Tensor], list[torch.Tensor | None], list[torch.Tensor]]:
    """(stepped tensors, their gradients, their state tensors) of a torch optimiser or a
    `trainer.zero.ShardedAdamW` (whose stepped tensors are slices or CPU copies of the parameters)."""
    inner = getattr(optimizer, "inner", optimizer)
    stepped = [p for group in inner.param_groups for p in group["params"]]
    states = [value for state in inner.state.values() for value in state.values() if isinstance(value, torch.Tensor)]
    return stepped, [p.grad for p in stepped], states


def measure_memory(params: list[torch.nn.Parameter], optimizer, device: torch.device) -> MemoryReport:
    """This rank's bytes in ``params``, their gradients and ``optimizer``'s state, and its peak memory.

    Parameters count first, so a master weight that is a view of one is not counted again; an optimiser's
    separate master copies (offload) count as optimiser state, their gradient copies as gradients.
    """
    counter = _StorageCounter(accelerator=device.type != "cpu")
    parameters = counter.count(params)
    gradients = counter.count(p.grad for p in params)
    stepped, stepped_grads, states = _optimizer_tensors(optimizer)
    optimizer_bytes = counter.count([*stepped, *states])
    extra_grads = counter.count(stepped_grads)
    if device.type == "cuda":
        peak, kind = torch.cuda.max_memory_allocated(device), "cuda_max_allocated"
    else:
        peak, kind = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * RSS_UNIT_BYTES, "cpu_peak_rss"
    rank = dist.get_rank() if dist.is_initialized() else 0
    return MemoryReport(rank=rank, parameters_device=parameters[0], parameters_cpu=parameters[1],
                        gradients_device=gradients[0] + extra_grads[0], gradients_cpu=gradients[1] + extra_grads[1],
                        optimizer_device=optimizer_bytes[0], optimizer_cpu=optimizer_bytes[1], peak_bytes=peak,
                        peak_kind=kind)


def gather_reports(report: MemoryReport) -> list[MemoryReport]:
    """Every rank's report, in rank order, on every rank (collective when distributed)."""
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return [report]
    gathered: list[dict | None] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, asdict(report))
    return [MemoryReport(**values) for values in gathered]
