"""`ParallelModel`: this rank's share of a model of any family, parallelised, and its forward/backward over
micro-batches.

It hides the layout from the training loop: ``run(microbatches)`` returns the sum of this rank's
micro-batch losses whether the model is one module, DDP, FSDP2, tensor-parallel or a pipeline stage.
What differs between families (building, splitting and sharding the model, the tensors a micro-batch
feeds it, its tied weight) comes from the family's `trainer.parallel.plan.ParallelPlan`. Parameter names
are always full-model names, with the last pipeline stage's copy of a tied output weight named like the
embedding, so optimiser state and checkpoints line up across layouts.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Iterator

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import loss_parallel

from trainer.checkpoint.load import copy_into_parameter
from trainer.config import ParallelismConfig
from trainer.data.batches import MicroBatch
from trainer.errors import TrainConfigError
from trainer.metrics.writers import StepTimer
from trainer.optim.grads import divide_grads, sync_tied_embedding_grad
from trainer.parallel.context import ContextLayout, apply_cp, context_parallel_loss
from trainer.parallel.keyed_dropout import sample_keys, set_tensor_parallel
from trainer.parallel.plan import ParallelPlan, Shape
from trainer.parallel.dims import ParallelDims
from trainer.parallel.recompute import Recompute, apply_recompute, as_recompute
from trainer.parallel.token_loss import step_tokens_per_loss, weighted_token_loss
from trainer.parallel.torch_compat import fix_dtensor_embedding_backward
from trainer.parallel.parallelize import apply_compile, apply_ddp, apply_fsdp, fsdp_options
from trainer.parallel.pipeline import build_schedule, stage_ids_of_rank, tied_embedding_group
from trainer.optim.auxiliary_losses import (
    auxiliary_modules,
    metric_kinds,
    pop_metrics,
    reduce_metrics,
    set_auxiliary_loss_scale,
)
from trainer.moe.layer import name_moe_layers
from trainer.moe.parallel import apply_ep, apply_expert_fsdp, ignore_expert_parameters, reduce_expert_grads
from trainer.parallel.zero import FULL_SHARD_STAGE, average_gradients, uses_fsdp


def _full(loss: torch.Tensor) -> torch.Tensor:
    """A loss as a plain tensor (under loss_parallel it is a replicated DTensor)."""
    return loss.full_tensor() if isinstance(loss, DTensor) else loss


def autocast_forward(module: nn.Module, device_type: str, dtype: torch.dtype) -> None:
    """Make ``module``'s forward run under ``torch.autocast(device_type, dtype)`` wherever it is called (directly,
    through DDP or FSDP2, as a pipeline stage), its bound method wrapped in place (Hugging Face Accelerate's
    way). The backward then runs outside autocast, in the dtypes the forward recorded, as PyTorch's AMP recipe has
    it: under autocast the backward's own products would be cast again (an fp32 gradient to bf16 and back, one
    copy kernel each, and a lower precision than the forward's where the forward computed in fp32)."""
    forward = module.forward

    @functools.wraps(forward)
    def forward_under_autocast(*args, **kwargs):
        with torch.autocast(device_type, dtype=dtype):
            return forward(*args, **kwargs)

    module.forward = forward_under_autocast


class ParallelModel:
    """This rank's model chunks, their parallel wrappers and, under pipelining, the schedule.

    Every rank builds the full model on the meta device, splits and shards it there (the family's
    ``plan``), then allocates its own share and fills it with that share of the full model's initial
    values drawn from ``seed`` (identical init in every layout, `_materialize`).

    Raises:
        TrainConfigError: the family's plan cannot split or shard the model in this layout.
    """

    def __init__(self, plan: ParallelPlan, shape: Shape, dims: ParallelDims, mesh: DeviceMesh | None,
                 parallelism: ParallelismConfig, device: torch.device, seed: int,
                 checkpoint_activations: bool | Recompute | None,
                 autocast_dtype: torch.dtype | None, compile_blocks: bool = False,
                 per_token_loss: bool = False, cpu_initialization: bool = False) -> None:
        self.plan = plan
        self.shape = shape
        self.tied_names = plan.tied_names(shape)
        self.dims = dims
        self.device = device
        self.loss_scale = 1.0
        # Times the forward and backward compute apart (`--timing-log-level 2`); the run sets its own.
        self.timer = StepTimer(enabled=False, device=device)
        with torch.device("meta"):
            model = plan.build(shape)
        name_moe_layers(model)
        pp_rank = mesh.get_local_rank("pp") if mesh is not None else 0
        # ZeRO (`trainer.parallel.zero`): FSDP2 at stages 2-3; DDP, or an all-reduce after backward where DDP cannot
        # wrap the model (tensor-parallel DTensors, pipeline stages), at stages 0-1.
        self.zero_stage = parallelism.zero_stage
        self.uses_fsdp = uses_fsdp(self.zero_stage, dims.replicas)
        self.cpu_offload = parallelism.cpu_offload
        # --grad-reduce-in-bf16: the data-parallel reductions' dtype (the optimiser still steps fp32 gradients).
        self.reduce_dtype = torch.bfloat16 if parallelism.grad_reduce_in_bf16 else torch.float32
        if dims.pp > 1:
            chunks = 1
            if parallelism.pipeline_schedule == "interleaved":
                chunks = plan.num_layers(shape) // (parallelism.num_layers_per_virtual_pipeline_stage * dims.pp)
            num_stages = dims.pp * chunks
            stage_ids = stage_ids_of_rank(pp_rank, dims.pp, chunks)
            self.parts = [plan.split_stage(model, stage_id, num_stages) for stage_id in stage_ids]
            self.has_first_stage = stage_ids[0] == 0
            self.has_last_stage = stage_ids[-1] == num_stages - 1
        else:
            self.parts = [model]
            self.has_first_stage = self.has_last_stage = True
        self.keyed_dropout, self.seed = parallelism.keyed_dropout, seed
        if self.keyed_dropout and "dropout_keys" not in inspect.signature(model.forward).parameters:
            raise TrainConfigError(f"keyed_dropout is not implemented for {type(model).__name__} models")
        recompute = as_recompute(checkpoint_activations)
        # The expert layout (ep, expert_dp): the run's mesh, or under cp one of its own over the same ranks.
        expert_mesh = dims.expert_mesh(mesh) if dims.ep > 1 else None
        for part in self.parts:
            if dims.tp > 1:
                fix_dtensor_embedding_backward()
                plan.apply_tp(part, mesh["tp"], parallelism.sequence_parallel)
                set_tensor_parallel(part, mesh.get_local_rank("tp"), parallelism.sequence_parallel)
            if dims.ep > 1:
                apply_ep(part, expert_mesh["ep"])
            if dims.cp > 1:
                apply_cp(part, mesh.get_group("cp"))
            if recompute is not None:
                apply_recompute(part, recompute)
            if compile_blocks:
                # One process holds the whole model, unwrapped: compiled whole, as `torch.compile(model)` would
                # be (one graph each way; per block, the host's launches between blocks starve a fast device at
                # small micro-batches). Otherwise each block, which FSDP2, DDP and the pipeline stages wrap.
                apply_compile([part] if dims.world_size == 1 else plan.blocks(part))
            if self.uses_fsdp:
                options = fsdp_options(self.zero_stage == FULL_SHARD_STAGE, self.cpu_offload, autocast_dtype,
                                       device.type, self.reduce_dtype)
                if dims.ep > 1:  # the experts' own units first, over expert_dp: the blocks' then skip them
                    apply_expert_fsdp(part, expert_mesh["expert_dp"], dims.replicas, options)
                apply_fsdp(part, plan.blocks(part), mesh[dims.replica_dim], options)
        self._materialize(model, seed, torch.device("cpu") if cpu_initialization else device)
        if autocast_dtype is not None:
            for part in self.parts:
                autocast_forward(part, device.type, autocast_dtype)
        self.forward_module: nn.Module = self.parts[0]
        replicated = dims.replicas > 1 and not self.uses_fsdp
        # The data-parallel (x context-parallel) group whose gradients `run` averages itself (no DDP wrapper).
        self.grad_group = mesh.get_group(dims.replica_dim) if replicated and (dims.tp > 1 or dims.pp > 1) else None
        if replicated and self.grad_group is None:
            if dims.ep > 1:  # expert weights are not replicated over dp: `reduce_expert_grads` averages them
                ignore_expert_parameters(self.parts[0])
            self.forward_module = apply_ddp(self.parts[0], mesh[dims.replica_dim], self.reduce_dtype)
        self.schedule = None
        self.tied_group = None
        if dims.pp > 1:
            self.schedule = build_schedule(self.parts, stage_ids, num_stages, mesh["pp"], device,
                                           dims.num_microbatches, parallelism.pipeline_schedule, self.loss_fn)
            if self.tied_names is not None:
                self.tied_group = tied_embedding_group(mesh)
        self.pp_group = mesh.get_group("pp") if mesh is not None and dims.pp > 1 else None
        self._named = self._collect_named_parameters()
        # Auxiliary losses (`trainer.optim.auxiliary_losses`): this rank's reporting modules; the metric names of the
        # whole model, so that every rank (every pipeline stage) reduces the same vector.
        self.auxiliary = auxiliary_modules(self.parts)
        self.auxiliary_kinds = metric_kinds(auxiliary_modules([model]))
        self.expert_dp_group = expert_mesh.get_group("expert_dp") if expert_mesh is not None else None
        # Context parallelism: this rank's share of every sequence, and the group its loss is the mean over.
        self.cp_group = mesh.get_group("cp") if dims.cp > 1 else None
        self.cp_layout = ContextLayout(dims.cp, mesh.get_local_rank("cp")) if dims.cp > 1 else None
        # Megatron's --calculate-per-token-loss (`trainer.parallel.token_loss`): the step's loss tokens are counted
        # over the dp x cp replicas, and each `run` weighs its micro-batch losses by them.
        self.per_token_loss = per_token_loss
        self.replica_group = mesh.get_group(dims.replica_dim) if dims.replicas > 1 else None
        self._tokens_per_loss: torch.Tensor | None = None
        self._auxiliary_forwards = 0

    # -- parameters ---------------------------------------------------------------------------------------

    def named_parameters(self) -> list[tuple[str, nn.Parameter]]:
        """This rank's parameters, each once, under full-model names."""
        return list(self._named)

    def _collect_named_parameters(self) -> list[tuple[str, nn.Parameter]]:
        return list(dict(self._parameters_of_parts()).items())

    def _parameters_of_parts(self) -> Iterator[tuple[str, nn.Parameter]]:
        """(full-model name, parameter) of every part, a later stage's copy of the tied weight named
        like the original."""
        tied = self.tied_names
        for part in self.parts:
            own = dict(part.named_parameters())
            for name, param in own.items():
                if tied is not None and name == tied[1] and tied[0] not in own:
                    name = tied[0]
                yield name, param

    def _materialize(self, full_model: nn.Module, seed: int, init_device: torch.device) -> None:
        """Allocate the parts (built, split and sharded on the meta device) and initialise them.

        The full model's parameters are drawn one at a time, in its own order, from ``seed`` by
        ``init_device``'s random generator; each part keeps its shard. Every layout thus starts from the
        same weights, while no rank ever holds more than its share plus one full tensor (a model too
        large for one device builds when its shares fit). Drawn on the CPU, they are the CPU run's on any device.
        """
        # FSDP2's CPU offload keeps the shards on the CPU: they are allocated there (its hooks move them).
        device = torch.device("cpu") if self.uses_fsdp and self.cpu_offload else self.device
        for part in self.parts:
            part.to_empty(device=device)
            part.tie_weights()  # to_empty gives a plain module's tied head a tensor of its own
        local: dict[str, list[nn.Parameter]] = {}
        for name, param in self._parameters_of_parts():
            local.setdefault(name, []).append(param)
        torch.manual_seed(seed)
        for name, meta_param in full_model.named_parameters():
            full = torch.empty(meta_param.shape, device=init_device)
            full_model.init_parameter(name, full)
            for param in local.get(name, ()):
                copy_into_parameter(param, full)

    # -- checkpoints --------------------------------------------------------------------------------------

    def checkpoint_state(self, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """``state`` (a run's checkpoint tensors: ``model.<name>``, ``optim.<name>.<key>``, ...) under the
        names checkpoints hold (the plan's ``to_checkpoint``, e.g. a fused q/k/v projection's tensors apart); ``state`` itself
        when the run computes in the checkpoint's layout. Collective under tensor parallelism and FSDP2."""
        if self.plan.to_checkpoint is None:
            return state
        return self.plan.to_checkpoint(state, self.shape)

    def restore_checkpoint_state(self, loaded: dict[str, torch.Tensor], state: dict[str, torch.Tensor]) -> None:
        """After loading a checkpoint into ``loaded = checkpoint_state(state)``: bring it back into ``state``
        (the parameters and optimiser state) in place. Collective as `checkpoint_state`."""
        if loaded is not state:
            self.plan.from_checkpoint(loaded, state, self.shape)

    def norm_parameters(self) -> list[nn.Parameter]:
        """Parameters counted in the global gradient norm: the tied copy of a later stage is left out."""
        tied = self.tied_names
        if self.has_first_stage or tied is None:
            return [p for _, p in self.named_parameters()]
        return [p for name, p in self.named_parameters() if name != tied[0]]

    def _tied_parameter(self) -> nn.Parameter | None:
        tied = self.tied_names
        return dict(self._named).get(tied[0]) if tied is not None else None

    # -- forward / backward -------------------------------------------------------------------------------

    def unscaled_loss(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The family's loss of a micro-batch (`ParallelPlan.loss`); with per-token loss its share of the step's
        mean over all loss tokens (`weighted_token_loss`); else, under context parallelism, this rank's share of
        the sequence's mean (`context_parallel_loss`)."""
        if self._tokens_per_loss is not None:
            return weighted_token_loss(self.plan.loss, outputs, targets, self._tokens_per_loss)
        if self.cp_group is not None:
            return context_parallel_loss(self.plan.loss, outputs, targets, self.cp_group)
        return self.plan.loss(outputs, targets)

    def loss_fn(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """`unscaled_loss` times the fp16 loss scale (the pipeline schedule's loss function)."""
        return self.unscaled_loss(outputs, targets) * self.loss_scale

    def _local_sequence(self, tensor: torch.Tensor) -> torch.Tensor:
        """A micro-batch tensor [batch, seq, ...] cut to this cp rank's tokens (itself without cp)."""
        return tensor if self.cp_layout is None else self.cp_layout.shard(tensor)

    def _compute_context(self) -> contextlib.AbstractContextManager:
        """Around the forward, the loss and the backward: under tensor parallelism ``loss_parallel`` (the head's
        logits stay sharded over the vocabulary; forward and backward both need it). Autocast is the parts' own
        (`autocast_forward`): the backward runs outside it."""
        return loss_parallel() if self.dims.tp > 1 else contextlib.nullcontext()

    def set_train(self, mode: bool) -> None:
        for part in self.parts:
            part.train(mode)

    def run(self, microbatches: list[MicroBatch], train: bool) -> tuple[torch.Tensor, bool]:
        """Forward (and, if ``train``, backward) over one step's micro-batches.

        Gradients accumulate as the mean over the micro-batches, scaled by ``loss_scale``; with per-token loss
        each micro-batch's loss is first weighted by its share of the step's loss tokens, so that the gradient and
        the reported loss are the mean over every loss token of the global batch (`trainer.parallel.token_loss`).

        Returns:
            The sum of the unscaled micro-batch losses on this rank, and whether this rank holds
            losses at all (under pipelining only the last stage does).
        """
        self._begin_auxiliary(len(microbatches))
        if self.per_token_loss and self.has_last_stage:  # collective over the (last stage's) dp x cp replicas
            self._tokens_per_loss = step_tokens_per_loss(
                [self._local_sequence(mb.targets.to(self.device)) for mb in microbatches], self.dims.replicas,
                self.replica_group)
        grad_context = contextlib.nullcontext() if train else torch.no_grad()
        with grad_context:
            if self.schedule is not None:
                total = self._run_pipeline(microbatches, train) / self.loss_scale
            else:
                total = self._run_local(microbatches, train)
        if train and self.grad_group is not None:
            average_gradients((p for _, p in self._named), self.grad_group, self.reduce_dtype)
        if train and self.dims.ep > 1 and not self.uses_fsdp:  # FSDP2's expert units reduce them themselves
            reduce_expert_grads([p for _, p in self._named], self.expert_dp_group, self.dims.replicas)
        return total, self.has_last_stage

    def _begin_auxiliary(self, num_microbatches: int) -> None:
        """Scale the auxiliary losses' gradients as the micro-batch losses' are (the pipeline schedule divides
        by the micro-batch count itself), and forget what an earlier run (an evaluation) recorded."""
        scale = self.loss_scale if self.schedule is not None else self.loss_scale / num_microbatches
        set_auxiliary_loss_scale(self.auxiliary, scale)
        pop_metrics(self.auxiliary)
        self._auxiliary_forwards = num_microbatches

    def auxiliary_metrics(self) -> dict[str, float]:
        """The auxiliary metrics of the last `run`, over all ranks (name -> value; empty for a model without
        any). Collective when the model has some: every rank calls it."""
        if not self.auxiliary_kinds:
            return {}
        # Each micro-batch passes every module once (the schedule's shape-inference pass is left out).
        records = pop_metrics(self.auxiliary, self._auxiliary_forwards)
        return reduce_metrics(records, self.auxiliary_kinds, self.device)

    def _run_local(self, microbatches: list[MicroBatch], train: bool) -> torch.Tensor:
        total = torch.zeros((), device=self.device)
        count = len(microbatches)
        for index, mb in enumerate(microbatches):
            last = index == count - 1
            with self._gradient_sync(enabled=last or not train), self._compute_context():
                # (An evaluation's forwards are not the step's: untimed.)
                with self.timer.phase("forward_compute") if train else contextlib.nullcontext():
                    inputs = map(self._local_sequence, self.plan.model_inputs(mb))
                    outputs = self.forward_module(*inputs, **self.plan.model_kwargs(mb),
                                                  **self._dropout_kwargs([mb], train))
                    # Unscaled: the scaled loss may overflow where the loss itself is finite, and the report
                    # (and its non-finite check, as Megatron's) must see the loss.
                    loss = self.unscaled_loss(outputs, self._local_sequence(mb.targets))
                if train:
                    with self.timer.phase("backward_compute"):
                        (loss * self.loss_scale / count).backward()
            total += _full(loss.detach())
        return total

    def _run_pipeline(self, microbatches: list[MicroBatch], train: bool) -> torch.Tensor:
        args = ()
        if self.has_first_stage:
            # The schedule splits its inputs into the micro-batches again along dim 0.
            args = tuple(self._local_sequence(torch.cat(tensors))
                         for tensors in zip(*map(self.plan.model_inputs, microbatches)))
        # Every stage's forward gets its micro-batch's keys: the schedule splits them like the inputs.
        kwargs: dict = self._dropout_kwargs(microbatches, train)
        losses: list[torch.Tensor] = []
        if self.has_last_stage:
            kwargs |= {"target": self._local_sequence(torch.cat([mb.targets for mb in microbatches])),
                       "losses": losses}
        with self._compute_context():
            if train:
                self.schedule.step(*args, return_outputs=False, **kwargs)
            else:
                self.schedule.eval(*args, return_outputs=False, **kwargs)
        if train:
            divide_grads((p for part in self.parts for p in part.parameters()), len(microbatches))
            sync_tied_embedding_grad(self._tied_parameter(), self.tied_group)
        total = torch.zeros((), device=self.device)
        for loss in losses:
            total += _full(loss.detach())
        return total

    def _dropout_kwargs(self, microbatches: list[MicroBatch], train: bool) -> dict[str, torch.Tensor]:
        """The model's ``dropout_keys`` argument under keyed dropout (`trainer.parallel.keyed_dropout`): int64
        [samples] keys of the micro-batches' samples, from the run's seed and their global sample ids.

        Raises:
            TrainConfigError: keyed dropout is on in training and a micro-batch has no sample ids.
        """
        if not self.keyed_dropout:
            return {}
        ids = [getattr(mb, "sample_ids", None) for mb in microbatches]
        if any(sample_ids is None for sample_ids in ids):
            if not train:
                return {}  # evaluation drops nothing: the keys would go unused
            raise TrainConfigError("keyed_dropout needs each micro-batch's sample ids (the family's collate gives "
                                   "them from the items of trainer.data.batches.step_batches)")
        return {"dropout_keys": sample_keys(self.seed, torch.cat(ids))}

    def _gradient_sync(self, enabled: bool) -> contextlib.AbstractContextManager:
        """Skip the data-parallel gradient reduction on all but the last accumulation micro-batch."""
        if self.uses_fsdp:
            for part in self.parts:
                part.set_requires_gradient_sync(enabled)
        elif not enabled and self.forward_module is not self.parts[0]:
            return self.forward_module.no_sync()
        return contextlib.nullcontext()
