"""`ParallelT5`: the trainer's `ParallelModel` for T5 — this rank's share of the model, parallelised,
and its forward/backward over `trainer.t5_data.T5MicroBatch`es.

    model = ParallelT5(shape, dims, mesh, parallelism, device, seed=1234, checkpoint_activations=False,
                       autocast_dtype=None)
    loss_sum, holds_loss = model.run(microbatches, train=True)      # what `train` calls for GPT

Only what differs from GPT is written here: building and splitting the T5 (`trainer.t5_pipeline`),
its tensor/data parallel plan (`trainer.t5_parallelize`), the tensors a micro-batch feeds the model,
and the tied weight's names (``shared.weight``; the last pipeline stage's copy is ``output.weight``
and exists only for tied variants). Loss, autocast/loss_parallel context, gradient accumulation,
the pipeline schedule and the tied-gradient sync are `ParallelModel`'s.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from trainer.config import ParallelismConfig
from trainer.errors import TrainConfigError
from trainer.grads import sync_tied_embedding_grad
from trainer.parallel_dims import ParallelDims
from trainer.parallelize import apply_ac, apply_ddp
from trainer.pipeline import build_schedule, stage_ids_of_rank, tied_embedding_group
from trainer.runner import ParallelModel, _full
from trainer.t5_data import T5MicroBatch
from trainer.t5_model import T5, T5Shape
from trainer.t5_parallelize import apply_t5_fsdp, apply_t5_tp
from trainer.t5_pipeline import split_t5_stage

T5_TIED_WEIGHT_NAME = "shared.weight"
T5_TIED_COPY_NAME = "output.weight"


class ParallelT5(ParallelModel):
    """This rank's T5 chunks, their parallel wrappers and, under pipelining, the schedule.

    Every rank builds the full model from ``seed`` before splitting and sharding it.

    Raises:
        TrainConfigError: sequence parallelism was asked for (not implemented for T5), or the
            layers do not divide into the pipeline stages.
    """

    def __init__(self, shape: T5Shape, dims: ParallelDims, mesh: DeviceMesh | None, parallelism: ParallelismConfig,
                 device: torch.device, seed: int, checkpoint_activations: bool,
                 autocast_dtype: torch.dtype | None) -> None:
        if parallelism.sequence_parallel:
            raise TrainConfigError("sequence_parallel is not implemented for T5")
        self.dims = dims
        self.device = device
        self.autocast_dtype = autocast_dtype
        self.loss_scale = 1.0
        self.tied = shape.tie_word_embeddings
        torch.manual_seed(seed)
        with torch.device(device):
            model = T5(shape)
        pp_rank = mesh.get_local_rank("pp") if mesh is not None else 0
        self.uses_fsdp = dims.dp > 1 and (dims.tp > 1 or dims.pp > 1 or parallelism.use_distributed_optimizer)
        if dims.pp > 1:
            chunks = 1
            if parallelism.pipeline_schedule == "interleaved":
                num_layers = shape.num_encoder_layers + shape.num_decoder_layers
                chunks = num_layers // (parallelism.num_layers_per_virtual_pipeline_stage * dims.pp)
            num_stages = dims.pp * chunks
            stage_ids = stage_ids_of_rank(pp_rank, dims.pp, chunks)
            try:
                self.parts = [split_t5_stage(model, stage_id, num_stages) for stage_id in stage_ids]
            except ValueError as error:
                raise TrainConfigError(str(error)) from error
            self.has_first_stage = stage_ids[0] == 0
            self.has_last_stage = stage_ids[-1] == num_stages - 1
        else:
            self.parts = [model]
            self.has_first_stage = self.has_last_stage = True
        for part in self.parts:
            if dims.tp > 1:
                try:
                    apply_t5_tp(part, mesh["tp"])
                except ValueError as error:
                    raise TrainConfigError(str(error)) from error
            if checkpoint_activations:
                apply_ac(part)
            if self.uses_fsdp:
                apply_t5_fsdp(part, mesh["dp"], reshard_after_forward=dims.pp == 1)
        self.forward_module: nn.Module = self.parts[0]
        if dims.dp > 1 and not self.uses_fsdp:
            self.forward_module = apply_ddp(self.parts[0], mesh["dp"])
        self.schedule = None
        self.tied_group = None
        if dims.pp > 1:
            self.schedule = build_schedule(self.parts, stage_ids, num_stages, mesh["pp"], device,
                                           dims.num_microbatches, parallelism.pipeline_schedule, self.loss_fn)
            if self.tied:
                self.tied_group = tied_embedding_group(mesh)
        self.pp_group = mesh.get_group("pp") if mesh is not None and dims.pp > 1 else None
        self._named = self._collect_named_parameters()

    def _collect_named_parameters(self) -> list[tuple[str, nn.Parameter]]:
        named: dict[str, nn.Parameter] = {}
        for part in self.parts:
            for name, param in part.named_parameters():
                if self.tied and name == T5_TIED_COPY_NAME and part.shared is None:
                    name = T5_TIED_WEIGHT_NAME
                named[name] = param
        return list(named.items())

    def norm_parameters(self) -> list[nn.Parameter]:
        """Parameters counted in the global gradient norm: a tied copy on a later stage is left out."""
        if self.has_first_stage or not self.tied:
            return [p for _, p in self.named_parameters()]
        return [p for name, p in self.named_parameters() if name != T5_TIED_WEIGHT_NAME]

    def _tied_parameter(self) -> nn.Parameter | None:
        return dict(self._named).get(T5_TIED_WEIGHT_NAME) if self.tied else None

    def _run_local(self, microbatches: list[T5MicroBatch], train: bool) -> torch.Tensor:
        total = torch.zeros((), device=self.device)
        count = len(microbatches)
        for index, mb in enumerate(microbatches):
            with self._gradient_sync(enabled=index == count - 1 or not train), self._compute_context():
                logits = self.forward_module(mb.encoder_input_ids, mb.decoder_input_ids, mb.encoder_attention_mask)
                loss = self.loss_fn(logits, mb.targets)
                if train:
                    (loss / count).backward()
            total += _full(loss.detach())
        return total

    def _run_pipeline(self, microbatches: list[T5MicroBatch], train: bool) -> torch.Tensor:
        args: tuple[torch.Tensor, ...] = ()
        if self.has_first_stage:
            args = tuple(torch.cat([getattr(mb, name) for mb in microbatches])
                         for name in ("encoder_input_ids", "decoder_input_ids", "encoder_attention_mask"))
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
        return sum((_full(loss.detach()) for loss in losses), torch.zeros((), device=self.device))
