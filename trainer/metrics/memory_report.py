"""``--print-memory``: what one rank holds after a step, by kind, device and host apart (DeepSpeed's T5 guide
prints the same after one step with and without offload).

    report = measure_memory(params, optimizer, device)   # bytes of this rank
    reports = gather_reports(report)                     # every rank's, on every rank

Bytes are counted per tensor *storage*, each once: a view (a ZeRO-1 slice of a parameter, FSDP2's padded
shard) counts the storage it lives in, so a master weight that is a view of its parameter costs nothing
extra, while an offloaded copy on the CPU counts as optimiser state there.

Within a step (`benchmarks.memory`), `StepStateSampler` counts the same at the points where a rank's model
states peak, with FSDP2's gathered weights and autocast's cached casts:

    with StepStateSampler(device) as sampler:
        train(config)
    sampler.peak()                                       # a StateSample
"""

from __future__ import annotations

import logging
import resource
import sys
from collections.abc import Iterable
from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist
from torch.autograd import Variable
from torch.distributed.tensor import DTensor
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

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
    `trainer.parallel.zero.ShardedAdamW` (whose stepped tensors are slices or CPU copies of the parameters)."""
    inner = getattr(optimizer, "inner", optimizer)
    stepped = [p for group in inner.param_groups for p in group["params"]]
    states = [value for state in inner.state.values() for value in state.values() if isinstance(value, torch.Tensor)]
    return stepped, [p.grad for p in stepped], states


# (device bytes, cpu bytes) of one kind of model state.
Bytes = tuple[int, int]


def _count_states(counter: _StorageCounter, params: Iterable[torch.Tensor],
                  optimizer) -> tuple[Bytes, Bytes, Bytes]:
    """(parameters, gradients, optimiser state) bytes of ``params`` and ``optimizer`` (None: no optimiser yet)
    not counted by ``counter`` before.

    Parameters count first, so a master weight that is a view of one is not counted again; an optimiser's
    separate master copies (offload) count as optimiser state, their gradient copies as gradients.
    """
    params = list(params)
    parameters = counter.count(params)
    gradients = counter.count(p.grad for p in params)
    if optimizer is None:
        return parameters, gradients, (0, 0)
    stepped, stepped_grads, states = _optimizer_tensors(optimizer)
    optimizer_bytes = counter.count([*stepped, *states])
    extra_grads = counter.count(stepped_grads)
    return parameters, (gradients[0] + extra_grads[0], gradients[1] + extra_grads[1]), optimizer_bytes


def measure_memory(params: list[torch.nn.Parameter], optimizer, device: torch.device) -> MemoryReport:
    """This rank's bytes in ``params``, their gradients and ``optimizer``'s state (`_count_states`), and its
    peak memory."""
    counter = _StorageCounter(accelerator=device.type != "cpu")
    parameters, gradients, optimizer_bytes = _count_states(counter, params, optimizer)
    if device.type == "cuda":
        peak, kind = torch.cuda.max_memory_allocated(device), "cuda_max_allocated"
    else:
        peak, kind = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * RSS_UNIT_BYTES, "cpu_peak_rss"
    rank = dist.get_rank() if dist.is_initialized() else 0
    return MemoryReport(rank=rank, parameters_device=parameters[0], parameters_cpu=parameters[1],
                        gradients_device=gradients[0], gradients_cpu=gradients[1],
                        optimizer_device=optimizer_bytes[0], optimizer_cpu=optimizer_bytes[1], peak_bytes=peak,
                        peak_kind=kind)


# The points of a training step where `StepStateSampler` counts a rank's model states.
FORWARD_END = "forward_end"
"""The model's forward returned (after FSDP2's post-forward resharding): gathered weights, autocast's casts."""
BACKWARD_END = "backward_end"
"""Backward's end (an autograd callback, after FSDP2's final one: its units resharded, their gradients
reduce-scattered); autocast's casts of the weights freed by then (see `StepStateSampler`)."""
BEFORE_STEP = "before_step"
"""The optimiser's step begins: gradients reduced (and sharded)."""
AFTER_STEP = "after_step"
STEP_POINTS = (FORWARD_END, BACKWARD_END, BEFORE_STEP, AFTER_STEP)
# The autograd node of a dtype cast (``Tensor.to``, autocast's casts).
CAST_NODE = "ToCopyBackward0"


@dataclass(frozen=True, slots=True)
class StateSample:
    """Model-state bytes one rank holds at one point of a training step, device and host together."""

    step: int
    """The optimiser step (1-based) the point belongs to."""
    point: str
    """One of STEP_POINTS."""
    parameters: int
    """The training tensors (replicated, or this rank's FSDP2 shards) and FSDP2's gathered copies of them
    while they are registered on the modules (between a unit's all-gather and its reshard)."""
    gradients: int
    optimizer: int
    autocast_copies: int
    """Autocast's low-precision casts of the parameters, alive for the backward: numel x the autocast dtype's
    size each."""

    def total(self) -> int:
        return self.parameters + self.gradients + self.optimizer + self.autocast_copies


def _castable_weight(leaf: torch.Tensor) -> bool:
    """Whether autocast casts ``leaf`` as a weight: the test of ATen's ``cached_cast`` (a float32 leaf that requires
    grad and is not a view)."""
    return leaf.dtype == torch.float32 and leaf.is_leaf and leaf.requires_grad and not leaf._is_view()


def autocast_copy_bytes(outputs: Iterable[torch.Tensor], dtype: torch.dtype) -> dict[int, int]:
    """Bytes of the casts to ``dtype`` that autocast made of the parameters ``outputs`` were computed from, which
    autograd keeps for the backward (an id per cast -> bytes). With autocast's cache on (its default) a weight is
    cast once however often the forward uses it; with it off, once per use.

    The casts themselves are not reachable from Python (autograd's saved tensors are inside its nodes); each
    shows in the autograd graph as a ToCopyBackward0 node whose input is the parameter's AccumulateGrad.
    """
    stack = [t.grad_fn for t in outputs if t.grad_fn is not None]
    seen: set = set()
    copies: dict[int, int] = {}
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        inputs = [function for function, _ in node.next_functions]
        leaf = getattr(inputs[0], "variable", None) if inputs else None
        if type(node).__name__ == CAST_NODE and leaf is not None and _castable_weight(leaf):
            copies[id(node)] = _local(leaf).numel() * dtype.itemsize
        stack.extend(inputs)
    return copies


class StepStateSampler:
    """Counts a rank's model states (`_count_states`, each storage once, plus autocast's casts of the weights) at
    the points of every training step where they peak (STEP_POINTS), without changing the training loop.

        with StepStateSampler(device) as sampler:
            train(config)
        sampler.peak()          # the largest StateSample of the steps after the first

    While entered it watches the process through torch's global hooks: the outermost module that runs a
    forward with gradients gets a forward hook (registered after FSDP2's own, so it sees the weights that
    forward leaves gathered) and, on its output, a gradient hook queueing an autograd callback that runs when
    backward ends (after FSDP2's final callback, queued by an earlier hook on the same output; DDP's, queued
    later, only copies averaged values into gradients that already exist); every torch optimiser's step (a
    `trainer.parallel.zero.ShardedAdamW`'s inner AdamW) is sampled before and after. The training tensors are the
    module's parameters when the step begins (FSDP2 has resharded them all by then). With ``autocast_dtype`` (the
    run's bf16 or fp16 autocast) its casts of the weights count at the end of forward: the model's forward runs
    under autocast and closes it on return (`trainer.parallel.runner.autocast_forward`), and autograd keeps the
    casts until the backward has used them, so none is left at the end of backward.

    Not counted, being out of reach of the modules and the optimiser: DDP's gradient buckets (another 4Ψ at
    stages 0-1, PyTorch's ``gradient_as_bucket_view=False``), FSDP2's unsharded gradients accumulated between
    the micro-batches of a step (kept in its own state while gradient sync is off), and the communication
    buffers of an all-gather or reduce-scatter in flight (the paper's temporary buffers).
    """

    def __init__(self, device: torch.device, autocast_dtype: torch.dtype | None = None) -> None:
        self.device = device
        self.autocast_dtype = autocast_dtype
        self.samples: list[StateSample] = []
        self._module: torch.nn.Module | None = None
        self._optimizer = None
        self._params: list[torch.Tensor] = []
        self._copies: dict[int, int] = {}
        self._step = 1
        self._depth = 0
        self._watched: set[int] = set()
        self._handles: list = []

    def __enter__(self) -> StepStateSampler:
        self._handles = [register_module_forward_pre_hook(self._enter_forward),
                         register_module_forward_hook(self._leave_forward, always_call=True),
                         register_optimizer_step_pre_hook(self._before_step),
                         register_optimizer_step_post_hook(self._after_step)]
        return self

    def __exit__(self, *exc_info) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def peak(self) -> StateSample:
        """The largest sample of the steps after the first (the first meets the optimiser only when it steps,
        and AdamW creates its moments in that step).

        Raises:
            ValueError: fewer than two steps were sampled.
        """
        later = [sample for sample in self.samples if sample.step > 1]
        if not later:
            raise ValueError("the peak within a step needs two sampled training steps")
        return max(later, key=StateSample.total)

    def _enter_forward(self, module: torch.nn.Module, args) -> None:
        if self._depth == 0 and torch.is_grad_enabled() and id(module) not in self._watched \
                and next(module.parameters(), None) is not None:
            self._watched.add(id(module))
            self._handles.append(module.register_forward_hook(self._forward_end))
        self._depth += 1

    def _leave_forward(self, module: torch.nn.Module, args, output) -> None:
        self._depth -= 1

    def _forward_end(self, module: torch.nn.Module, args, output) -> None:
        outputs = output if isinstance(output, (tuple, list)) else (output,)
        tensors = [t for t in outputs if isinstance(t, torch.Tensor) and t.requires_grad]
        if not tensors or not torch.is_grad_enabled():
            return  # an evaluation
        self._module = module
        self._copies = autocast_copy_bytes(tensors, self.autocast_dtype) if self.autocast_dtype is not None else {}
        self._sample(FORWARD_END, with_copies=True)
        tensors[0].register_hook(self._queue_backward_end)

    def _queue_backward_end(self, grad: torch.Tensor) -> None:
        Variable._execution_engine.queue_callback(self._backward_end)

    def _backward_end(self) -> None:
        self._sample(BACKWARD_END, with_copies=False)  # the backward has used, and freed, every cast

    def _before_step(self, optimizer: torch.optim.Optimizer, args, kwargs) -> None:
        self._optimizer = optimizer
        if self._module is not None:
            self._params = list(self._module.parameters())
        self._sample(BEFORE_STEP, with_copies=False)

    def _after_step(self, optimizer: torch.optim.Optimizer, args, kwargs) -> None:
        self._sample(AFTER_STEP, with_copies=False)
        self._step += 1

    def _sample(self, point: str, with_copies: bool) -> None:
        counter = _StorageCounter(accelerator=self.device.type != "cpu")
        current = list(self._module.parameters()) if self._module is not None else []
        parameters, gradients, optimizer = _count_states(counter, [*current, *self._params], self._optimizer)
        self.samples.append(StateSample(step=self._step, point=point, parameters=sum(parameters),
                                        gradients=sum(gradients), optimizer=sum(optimizer),
                                        autocast_copies=sum(self._copies.values()) if with_copies else 0))


def gather_reports(report: MemoryReport) -> list[MemoryReport]:
    """Every rank's report, in rank order, on every rank (collective when distributed)."""
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return [report]
    gathered: list[dict | None] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, asdict(report))
    return [MemoryReport(**values) for values in gathered]
