"""`ParallelModel`: this rank's share of the GPT, parallelised, and its forward/backward over micro-batches.

It hides the layout from the training loop: ``run(microbatches)`` returns the sum of this rank's
micro-batch losses whether the model is one module, DDP, FSDP2, tensor-parallel or a pipeline stage.
Parameter names are always full-model names, with the last pipeline stage's copy of the tied output
weight named ``tok_embeddings.weight`` like the original, so optimiser state and checkpoints line up
across layouts.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import loss_parallel

from trainer.checkpoint import copy_into_parameter
from trainer.config import ParallelismConfig
from trainer.data import IGNORE_INDEX, MicroBatch
from trainer.models.gpt.fused_qkv import from_checkpoint, is_fused_name, to_checkpoint
from trainer.grads import sync_tied_embedding_grad
from trainer.models.gpt.model import GPT, GPTShape
from trainer.parallel_dims import ParallelDims
from trainer.models.gpt.parallelize import apply_ac, apply_ddp, apply_fsdp, apply_tp
from trainer.pipeline import build_schedule, split_stage, stage_ids_of_rank, tied_embedding_group

TIED_WEIGHT_NAME = "tok_embeddings.weight"
TIED_COPY_NAME = "output.weight"


def _full(loss: torch.Tensor) -> torch.Tensor:
    """A loss as a plain tensor (under loss_parallel it is a replicated DTensor)."""
    return loss.full_tensor() if isinstance(loss, DTensor) else loss


def apply_compile(blocks: list[nn.Module]) -> None:
    """``torch.compile`` each block's forward in place (torchtitan's ``apply_compile``: per block, after
    tensor parallelism and activation checkpointing, before FSDP).

    Per block, not the whole model: the blocks share one code object, so dynamo compiles a block kind
    once and reuses it for its siblings, and the embeddings, head and parallel wrappers stay eager. The
    forward is replaced rather than the module wrapped (``torch.compile(module)``), so parameter names
    (checkpoints, optimiser state) gain no ``_orig_mod.`` and the hooks FSDP2 registers on the block
    later run eagerly around the compiled code, as they do around torchtitan's wrapper.
    ``fullgraph=True``: a graph break inside a block is a bug to fix, not a silent slowdown.
    """
    for block in blocks:
        block.forward = torch.compile(block.forward, fullgraph=True)


class ParallelModel:
    """This rank's model chunks, their parallel wrappers and, under pipelining, the schedule.

    Every rank builds the full model on the meta device, splits and shards it there, then allocates
    its own share and fills it with that share of the full model's initial values drawn from ``seed``
    (identical init in every layout, `_materialize`). The GPT is the default; another model
    (`trainer.models.t5.runner.ParallelT5`) overrides the model hooks (``_build``, ``_num_layers``, ``_split``,
    ``_apply_tp``, ``_apply_fsdp``, ``_tied_names``, ``_blocks``) and the batch hooks (``_forward``,
    ``_first_stage_inputs``).
    """

    def __init__(self, shape: GPTShape, dims: ParallelDims, mesh: DeviceMesh | None, parallelism: ParallelismConfig,
                 device: torch.device, seed: int, checkpoint_activations: bool,
                 autocast_dtype: torch.dtype | None, compile_blocks: bool = False) -> None:
        self.shape = shape
        self.dims = dims
        self.device = device
        self.autocast_dtype = autocast_dtype
        self.loss_scale = 1.0
        with torch.device("meta"):
            model = self._build()
        pp_rank = mesh.get_local_rank("pp") if mesh is not None else 0
        self.uses_fsdp = dims.dp > 1 and (dims.tp > 1 or dims.pp > 1 or parallelism.use_distributed_optimizer)
        if dims.pp > 1:
            chunks = 1
            if parallelism.pipeline_schedule == "interleaved":
                chunks = self._num_layers() // (parallelism.num_layers_per_virtual_pipeline_stage * dims.pp)
            num_stages = dims.pp * chunks
            stage_ids = stage_ids_of_rank(pp_rank, dims.pp, chunks)
            self.parts = [self._split(model, stage_id, num_stages) for stage_id in stage_ids]
            self.has_first_stage = stage_ids[0] == 0
            self.has_last_stage = stage_ids[-1] == num_stages - 1
        else:
            self.parts = [model]
            self.has_first_stage = self.has_last_stage = True
        for part in self.parts:
            if dims.tp > 1:
                self._apply_tp(part, mesh["tp"], parallelism.sequence_parallel)
            if checkpoint_activations:
                apply_ac(part)
            if compile_blocks:
                apply_compile(self._blocks(part))
            if self.uses_fsdp:
                self._apply_fsdp(part, mesh["dp"], reshard_after_forward=dims.pp == 1)
        self._materialize(model, seed)
        self.forward_module: nn.Module = self.parts[0]
        if dims.dp > 1 and not self.uses_fsdp:
            self.forward_module = apply_ddp(self.parts[0], mesh["dp"])
        self.schedule = None
        self.tied_group = None
        if dims.pp > 1:
            self.schedule = build_schedule(self.parts, stage_ids, num_stages, mesh["pp"], device,
                                           dims.num_microbatches, parallelism.pipeline_schedule, self.loss_fn)
            if self._tied_names() is not None:
                self.tied_group = tied_embedding_group(mesh)
        self.pp_group = mesh.get_group("pp") if mesh is not None and dims.pp > 1 else None
        self._named = self._collect_named_parameters()

    # -- model hooks ---------------------------------------------------------------------------------------

    def _build(self) -> nn.Module:
        """The full model, on the current default device."""
        return GPT(self.shape)

    def _num_layers(self) -> int:
        """Blocks the pipeline stages divide."""
        return self.shape.num_layers

    def _split(self, model: nn.Module, stage_id: int, num_stages: int) -> nn.Module:
        """Pipeline stage ``stage_id`` of ``num_stages`` of the full model."""
        return split_stage(model, stage_id, num_stages)

    def _apply_tp(self, part: nn.Module, tp_mesh: DeviceMesh, sequence_parallel: bool) -> None:
        apply_tp(part, tp_mesh, sequence_parallel)

    def _apply_fsdp(self, part: nn.Module, dp_mesh: DeviceMesh, reshard_after_forward: bool) -> None:
        apply_fsdp(part, dp_mesh, reshard_after_forward=reshard_after_forward)

    def _tied_names(self) -> tuple[str, str] | None:
        """(embedding name, name of the last stage's copy) of the tied input/output weight; None if untied."""
        return TIED_WEIGHT_NAME, TIED_COPY_NAME

    def _blocks(self, part: nn.Module) -> list[nn.Module]:
        """The transformer blocks of a part, each compiled on its own under ``compile_blocks``."""
        return list(part.layers.values())

    # -- batch hooks ---------------------------------------------------------------------------------------

    def _forward(self, mb: MicroBatch) -> torch.Tensor:
        """Logits of one micro-batch through the (unsplit) model."""
        return self.forward_module(mb.tokens, mb.position_ids)

    def _first_stage_inputs(self, microbatches: list[MicroBatch]) -> tuple[torch.Tensor, ...]:
        """The first pipeline stage's inputs of a whole step, concatenated over the micro-batches."""
        return torch.cat([mb.tokens for mb in microbatches]), torch.cat([mb.position_ids for mb in microbatches])

    # -- parameters ---------------------------------------------------------------------------------------

    def named_parameters(self) -> list[tuple[str, nn.Parameter]]:
        """This rank's parameters, each once, under full-model names."""
        return list(self._named)

    def _collect_named_parameters(self) -> list[tuple[str, nn.Parameter]]:
        return list(dict(self._parameters_of_parts()).items())

    def _parameters_of_parts(self) -> Iterator[tuple[str, nn.Parameter]]:
        """(full-model name, parameter) of every part, a later stage's copy of the tied weight named
        like the original."""
        tied = self._tied_names()
        for part in self.parts:
            own = dict(part.named_parameters())
            for name, param in own.items():
                if tied is not None and name == tied[1] and tied[0] not in own:
                    name = tied[0]
                yield name, param

    def _materialize(self, full_model: nn.Module, seed: int) -> None:
        """Allocate the parts (built, split and sharded on the meta device) and initialise them.

        The full model's parameters are drawn one at a time, in its own order, from ``seed``; each
        part keeps its shard. Every layout thus starts from the same weights, while no rank ever holds
        more than its share plus one full tensor (a model too large for one device builds when its
        shares fit).
        """
        for part in self.parts:
            part.to_empty(device=self.device)
            part.tie_weights()  # to_empty gives a plain module's tied head a tensor of its own
        local: dict[str, list[nn.Parameter]] = {}
        for name, param in self._parameters_of_parts():
            local.setdefault(name, []).append(param)
        torch.manual_seed(seed)
        for name, meta_param in full_model.named_parameters():
            full = torch.empty(meta_param.shape, device=self.device)
            full_model.init_parameter(name, full)
            for param in local.get(name, ()):
                copy_into_parameter(param, full)

    # -- checkpoints --------------------------------------------------------------------------------------

    def checkpoint_state(self, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """``state`` (a run's checkpoint tensors: ``model.<name>``, ``optim.<name>.<key>``, ...) under the
        names checkpoints hold, q, k and v apart (`trainer.models.gpt.fused_qkv.to_checkpoint`); ``state`` itself when
        the model has no fused projection. Collective under tensor parallelism and FSDP2."""
        if not any(is_fused_name(name) for name in state):
            return state
        return to_checkpoint(state, self.shape.num_attention_heads)

    def restore_checkpoint_state(self, loaded: dict[str, torch.Tensor], state: dict[str, torch.Tensor]) -> None:
        """After loading a checkpoint into ``loaded = checkpoint_state(state)``: fuse its q, k and v tensors
        back into ``state`` (the parameters and optimiser state) in place. Collective as `checkpoint_state`."""
        if loaded is not state:
            from_checkpoint(loaded, state, self.shape.num_attention_heads)

    def norm_parameters(self) -> list[nn.Parameter]:
        """Parameters counted in the global gradient norm: the tied copy of a later stage is left out."""
        tied = self._tied_names()
        if self.has_first_stage or tied is None:
            return [p for _, p in self.named_parameters()]
        return [p for name, p in self.named_parameters() if name != tied[0]]

    def _tied_parameter(self) -> nn.Parameter | None:
        tied = self._tied_names()
        return dict(self._named).get(tied[0]) if tied is not None else None

    # -- forward / backward -------------------------------------------------------------------------------

    def loss_fn(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean cross-entropy over the unmasked tokens of a micro-batch, times the fp16 loss scale."""
        loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), ignore_index=IGNORE_INDEX)
        return loss * self.loss_scale

    @contextlib.contextmanager
    def _compute_context(self) -> Iterator[None]:
        with contextlib.ExitStack() as stack:
            if self.autocast_dtype is not None:
                stack.enter_context(torch.autocast(self.device.type, dtype=self.autocast_dtype))
            if self.dims.tp > 1:
                # The head's logits stay sharded over the vocabulary; forward and backward both need it.
                stack.enter_context(loss_parallel())
            yield

    def set_train(self, mode: bool) -> None:
        for part in self.parts:
            part.train(mode)

    def run(self, microbatches: list[MicroBatch], train: bool) -> tuple[torch.Tensor, bool]:
        """Forward (and, if ``train``, backward) over one step's micro-batches.

        Gradients accumulate as the mean over the micro-batches, scaled by ``loss_scale``.

        Returns:
            The sum of the unscaled micro-batch losses on this rank, and whether this rank holds
            losses at all (under pipelining only the last stage does).
        """
        grad_context = contextlib.nullcontext() if train else torch.no_grad()
        with grad_context:
            if self.schedule is not None:
                total = self._run_pipeline(microbatches, train)
            else:
                total = self._run_local(microbatches, train)
        return total / self.loss_scale, self.has_last_stage

    def _run_local(self, microbatches: list[MicroBatch], train: bool) -> torch.Tensor:
        total = torch.zeros((), device=self.device)
        count = len(microbatches)
        for index, mb in enumerate(microbatches):
            last = index == count - 1
            with self._gradient_sync(enabled=last or not train), self._compute_context():
                loss = self.loss_fn(self._forward(mb), mb.targets)
                if train:
                    (loss / count).backward()
            total += _full(loss.detach())
        return total

    def _run_pipeline(self, microbatches: list[MicroBatch], train: bool) -> torch.Tensor:
        args = self._first_stage_inputs(microbatches) if self.has_first_stage else ()
        kwargs: dict = {}
        losses: list[torch.Tensor] = []
        if self.has_last_stage:
            kwargs = {"target": torch.cat([mb.targets for mb in microbatches]), "losses": losses}
        with self._compute_context():
            if train:
                self.schedule.step(*args, return_outputs=False, **kwargs)
            else:
                self.schedule.eval(*args, return_outputs=False, **kwargs)
        if train:
            sync_tied_embedding_grad(self._tied_parameter(), self.tied_group)
        total = torch.zeros((), device=self.device)
        for loss in losses:
            total += _full(loss.detach())
        return total

    def _gradient_sync(self, enabled: bool) -> contextlib.AbstractContextManager:
        """Skip the data-parallel gradient reduction on all but the last accumulation micro-batch."""
        if self.uses_fsdp:
            for part in self.parts:
                part.set_requires_gradient_sync(enabled)
        elif not enabled and self.forward_module is not self.parts[0]:
            return self.forward_module.no_sync()
        return contextlib.nullcontext()
