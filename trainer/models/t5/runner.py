"""`ParallelT5`: the trainer's `ParallelModel` for T5 — this rank's share of the model, parallelised,
and its forward/backward over `trainer.models.t5.data.T5MicroBatch`es.

    model = ParallelT5(shape, dims, mesh, parallelism, device, seed=1234, checkpoint_activations=False,
                       autocast_dtype=None)
    loss_sum, holds_loss = model.run(microbatches, train=True)      # what `train` calls for GPT

Only `ParallelModel`'s hooks are written here: building and splitting the T5 (`trainer.models.t5.pipeline`),
its tensor/data parallel plan (`trainer.models.t5.parallelize`), its blocks (compiled one by one under
``--compile``), the tensors a micro-batch feeds the model, and the tied weight's names (``shared.weight``;
the last pipeline stage's copy is ``output.weight`` and exists only for tied variants). Loss,
autocast/loss_parallel context, gradient accumulation, the pipeline schedule and the tied-gradient sync
are `ParallelModel`'s.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from trainer.errors import TrainConfigError
from trainer.runner import ParallelModel
from trainer.models.t5.data import T5MicroBatch
from trainer.models.t5.model import T5
from trainer.models.t5.parallelize import apply_t5_fsdp, apply_t5_tp
from trainer.models.t5.pipeline import split_t5_stage

T5_TIED_WEIGHT_NAME = "shared.weight"
T5_TIED_COPY_NAME = "output.weight"
T5_INPUTS = ("encoder_input_ids", "decoder_input_ids", "encoder_attention_mask")


class ParallelT5(ParallelModel):
    """This rank's T5 chunks, their parallel wrappers and, under pipelining, the schedule.

    The model is built, split and sharded on the meta device and then initialised from ``seed`` as
    `ParallelModel` does.

    Raises:
        TrainConfigError: sequence parallelism was asked for (not implemented for T5), or the
            layers do not divide into the pipeline stages.
    """

    def _build(self) -> nn.Module:
        return T5(self.shape)

    def _num_layers(self) -> int:
        return self.shape.num_encoder_layers + self.shape.num_decoder_layers

    def _split(self, model: nn.Module, stage_id: int, num_stages: int) -> nn.Module:
        try:
            return split_t5_stage(model, stage_id, num_stages)
        except ValueError as error:
            raise TrainConfigError(str(error)) from error

    def _apply_tp(self, part: nn.Module, tp_mesh: DeviceMesh, sequence_parallel: bool) -> None:
        if sequence_parallel:
            raise TrainConfigError("sequence_parallel is not implemented for model t5")
        try:
            apply_t5_tp(part, tp_mesh)
        except ValueError as error:
            raise TrainConfigError(str(error)) from error

    def _apply_fsdp(self, part: nn.Module, dp_mesh: DeviceMesh, reshard_after_forward: bool) -> None:
        apply_t5_fsdp(part, dp_mesh, reshard_after_forward=reshard_after_forward)

    def _tied_names(self) -> tuple[str, str] | None:
        # Only tied variants (v1.0) have a copy of the shared embedding on the last stage.
        return (T5_TIED_WEIGHT_NAME, T5_TIED_COPY_NAME) if self.shape.tie_word_embeddings else None

    def _blocks(self, part: nn.Module) -> list[nn.Module]:
        return [*part.encoder_layers.values(), *part.decoder_layers.values()]

    def _forward(self, mb: T5MicroBatch) -> torch.Tensor:
        return self.forward_module(*(getattr(mb, name) for name in T5_INPUTS))

    def _first_stage_inputs(self, microbatches: list[T5MicroBatch]) -> tuple[torch.Tensor, ...]:
        return tuple(torch.cat([getattr(mb, name) for mb in microbatches]) for name in T5_INPUTS)
