"""This rank's share of a T5/mT5 for generation: a pipeline stage, tensor-parallel, in eval mode.

The T5 counterpart of `trainer.models.gpt.sharded.ShardedGPT`. It reuses the trainer's pieces
(`split_t5_stage`, `apply_t5_tp`, `trainer.moe.parallel.apply_ep`, the trainer's mesh): a stage holds encoder
and/or decoder blocks (the encoder's then the decoder's layers, cut into equal ranges), a MoE layer's experts
are sharded over the ep ranks (Switch Transformers; `trainer.generation.layout` says how they step together),
and tensors move between stages with plain point-to-point sends in a fixed order, which gloo runs on CPU:

once per batch (`ShardedT5.encode`):
  - stage s -> s + 1, from stage 0 up to the first decoder stage (the one holding decoder layer 0,
    the encoder's final norm and the decoder's position-bias table): the encoder hidden states
    [batch, Le, d_model], and, to a stage with encoder layers, the encoder position bias
    [1, heads / tp, Le, Le] (its table lives on stage 0; each stage adds the padding mask itself);
  - the first decoder stage -> every later stage: the encoder output (memory) [batch, Le, d_model] and
    the decoder position-bias row of the whole generation [1, heads / tp, 1, max_length];
every decoding step (`ShardedT5.next_tokens`):
  - stage 0 -> the first decoder stage (when they differ): the embedded newest token [batch, 1, d_model];
  - decoder stage s -> s + 1: its hidden states [batch, 1, d_model];
  - the last stage picks the next tokens and broadcasts them over its pipeline group, so every rank
    leaves with the same ids.
Encoder-only stages between them take part in the broadcast only. Each decoder stage keeps its layers'
self-attention keys/values (growing one position per step) and cross-attention keys/values (computed
from the memory at the first step) in `DecoderState.cache`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor

from trainer.generation.head import PretransposedHead
from trainer.generation.layout import GenerationLayout
from trainer.models.t5.model import T5, T5Shape, padding_bias
from trainer.models.t5.parallelize import apply_t5_tp
from trainer.models.t5.pipeline import split_t5_stage, t5_stage_layers
from trainer.moe.parallel import apply_ep

# The tied embedding, and the last pipeline stage's copy of it (a tied head without the embedding).
TIED_WEIGHT_NAME = "shared.weight"
TIED_COPY_NAME = "output.weight"


def sharded_t5_layout(shape: T5Shape, tp: int, pp: int, world_size: int, ep: int = 1) -> GenerationLayout:
    """The layout of a T5 generation run, checked: heads (and their position-bias columns), d_ff and the
    (padded) vocabulary split over tp; the encoder + decoder layers over pp; the experts over ep; the world
    over tp x pp x ep.

    Raises:
        TrainConfigError: naming the size that does not divide.
    """
    split_by_tp = {"num_heads": shape.num_heads, "d_ff": shape.d_ff,
                   "the checkpoint's padded vocabulary": shape.vocab_size}
    layers = shape.num_encoder_layers + shape.num_decoder_layers
    split_by_pp = {f"encoder + decoder layers {shape.num_encoder_layers} + {shape.num_decoder_layers}": layers}
    num_experts = shape.moe.num_experts if shape.moe is not None else None
    return GenerationLayout.resolve(tp, pp, world_size, split_by_tp, split_by_pp, ep, num_experts)


@dataclass(slots=True)
class DecoderState:
    """What a stage keeps while decoding one batch (set by `ShardedT5.encode`; None where the stage has no use)."""

    memory: torch.Tensor | None
    """Encoder output [batch, Le, d_model] (decoder stages)."""
    memory_bias: torch.Tensor
    """Additive padding mask of the encoder positions [batch, 1, 1, Le]."""
    position_bias: torch.Tensor | None
    """Decoder position bias of query ``max_length - 1`` over keys 0 .. max_length - 1,
    [1, heads / tp, 1, max_length]; step p uses its last p + 1 columns (decoder stages)."""
    max_length: int
    """Decoder positions this batch may feed (the start token and max_new_tokens - 1 generated ones)."""
    length: int = 0
    """Decoder positions fed so far."""
    cache: dict = field(default_factory=dict)
    """The decoder layers' keys/values, by layer name (`trainer.models.t5.model.T5.run_decoder_layers`)."""


class ShardedT5:
    """This rank's pipeline stage of ``T5(shape)``, sharded over the tp ranks (its experts over the ep ranks),
    ready to decode."""

    def __init__(self, shape: T5Shape, vocab_size: int, layout: GenerationLayout, mesh: DeviceMesh | None,
                 device: torch.device) -> None:
        """Build the stage on the meta device, split and shard it there, then allocate this rank's share
        on ``device`` (uninitialised: load the weights next).

        Args:
            shape: the model, vocabulary padded (as the checkpoint holds it, or as tp needs).
            vocab_size: the real vocabulary; logits of the padding rows are never chosen.
        """
        self.shape, self.vocab_size, self.device = shape, vocab_size, device
        self.pp = layout.pp
        self.pp_rank = mesh.get_local_rank("pp") if mesh is not None else 0
        with torch.device("meta"):
            model = T5(shape)
        self.stage = split_t5_stage(model, self.pp_rank, layout.pp) if layout.pp > 1 else model
        if layout.tp > 1:
            apply_t5_tp(self.stage, mesh["tp"])
        if layout.ep > 1:  # before allocating: each rank only ever holds its experts
            apply_ep(self.stage, mesh["ep"])
        self.stage.to_empty(device=device)
        self.stage.tie_weights()  # to_empty gives a tied head a tensor of its own
        self.stage.eval()
        self.local_heads = shape.num_heads // layout.tp
        stages = [t5_stage_layers(shape.num_encoder_layers, shape.num_decoder_layers, s, layout.pp)
                  for s in range(layout.pp)]
        self.has_encoder_layers = [len(encoder) > 0 for encoder, _ in stages]
        self.first_decoder_stage = next(s for s, (_, decoder) in enumerate(stages) if len(decoder) > 0)
        self.is_first, self.is_last = self.pp_rank == 0, self.pp_rank == layout.pp - 1
        self.pp_group = mesh.get_group("pp") if layout.pp > 1 else None
        self.dp_group = mesh.get_group("dp") if mesh is not None and layout.dp > 1 else None
        self.dp_rank = mesh.get_local_rank("dp") if mesh is not None else 0
        self.ep_group = mesh.get_group("ep") if layout.ep > 1 else None
        """The ranks this one's MoE layers exchange tokens with (None without expert parallelism)."""

    def named_parameters(self) -> list[tuple[str, nn.Parameter]]:
        """Parameters under full-model names (a last stage's tied head copy is ``shared.weight``, as in
        checkpoints)."""
        tied_copy = self.shape.tie_word_embeddings and self.stage.shared is None
        return [(TIED_WEIGHT_NAME if tied_copy and name == TIED_COPY_NAME else name, param)
                for name, param in self.stage.named_parameters()]

    def finish_loading(self) -> None:
        """Call once the weights are in place: on CPU, a plain (not tensor-parallel) head becomes a
        `PretransposedHead` copy (T5-small's 32128 x 512 head at batch 4 is about a quarter faster against
        a contiguous transpose); parameters are not to be loaded again afterwards."""
        head = self.stage.output
        if self.device.type == "cpu" and isinstance(head, nn.Linear) and not isinstance(head.weight, DTensor):
            self.stage.output = PretransposedHead(head.weight)

    # -- point-to-point ---------------------------------------------------------------------------------

    def _global_rank(self, pp_rank: int) -> int:
        return dist.get_global_rank(self.pp_group, pp_rank)

    def _send(self, tensor: torch.Tensor, pp_rank: int) -> None:
        dist.send(tensor.contiguous(), dst=self._global_rank(pp_rank), group=self.pp_group)

    def _recv(self, shape: tuple[int, ...], pp_rank: int) -> torch.Tensor:
        tensor = torch.empty(shape, device=self.device)
        dist.recv(tensor, src=self._global_rank(pp_rank), group=self.pp_group)
        return tensor

    # -- generation -------------------------------------------------------------------------------------

    @torch.no_grad()
    def encode(self, encoder_ids: torch.Tensor, attention_mask: torch.Tensor, max_length: int) -> DecoderState:
        """Run the encoder once over a batch (collective over the pipeline group).

        Args:
            encoder_ids: int64 [batch, Le] (read by stage 0 only).
            attention_mask: int64 [batch, Le], 1 token, 0 padding (every rank holds it).
            max_length: decoder positions the batch may feed.

        Returns:
            This stage's state for `next_tokens`.
        """
        stage, rank, first_decoder = self.stage, self.pp_rank, self.first_decoder_stage
        batch, length = encoder_ids.shape
        hidden = (batch, length, self.shape.d_model)
        memory_bias = padding_bias(attention_mask, torch.float32)
        h = encoder_bias = memory = position_bias = None
        if self.is_first:
            h = stage.shared(encoder_ids)
            encoder_bias = stage.encoder_position_bias(length, length)
        elif rank <= first_decoder:
            h = self._recv(hidden, rank - 1)
            if self.has_encoder_layers[rank]:
                encoder_bias = self._recv((1, self.local_heads, length, length), rank - 1)
        if self.has_encoder_layers[rank]:
            h = stage.run_encoder_layers(h, encoder_bias + memory_bias)
        if rank < first_decoder:
            self._send(h, rank + 1)
            if self.has_encoder_layers[rank + 1]:
                self._send(encoder_bias, rank + 1)
        elif rank == first_decoder:
            memory = stage.encoder_norm(h)
            # One row holds every relative distance a step needs (0 back to max_length - 1).
            position_bias = stage.decoder_position_bias(1, max_length, query_offset=max_length - 1)
            for later in range(rank + 1, self.pp):
                self._send(memory, later)
                self._send(position_bias, later)
        else:
            memory = self._recv(hidden, first_decoder)
            position_bias = self._recv((1, self.local_heads, 1, max_length), first_decoder)
        return DecoderState(memory, memory_bias, position_bias, max_length)

    @torch.no_grad()
    def next_tokens(self, tokens: torch.Tensor, state: DecoderState,
                    choose: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """Feed the newest decoder tokens and return the next ones (collective over the model's ranks).

        Args:
            tokens: int64 [batch, 1] (read by stage 0 only).
            state: this batch's `encode` result; advanced by one position.
            choose: float logits [batch, vocab_size] -> int64 tokens [batch] (run on the last stage).

        Returns:
            int64 [batch], identical on every rank of the pipeline.
        """
        stage, rank, first_decoder = self.stage, self.pp_rank, self.first_decoder_stage
        if state.length >= state.max_length:
            raise ValueError(f"decoding past the {state.max_length} positions the batch was encoded for")
        batch = tokens.shape[0]
        step = (batch, 1, self.shape.d_model)
        h = stage.shared(tokens) if self.is_first else None
        if rank >= first_decoder:
            if rank == first_decoder and not self.is_first:
                h = self._recv(step, 0)
            elif rank > first_decoder:
                h = self._recv(step, rank - 1)
            bias = state.position_bias[..., state.max_length - 1 - state.length:]
            h = stage.run_decoder_layers(h, bias, state.memory, state.memory_bias, state.cache)
            if not self.is_last:
                self._send(h, rank + 1)
        elif self.is_first:
            self._send(h, first_decoder)
        state.length += 1
        if self.is_last:
            logits = stage.head(h)
            logits = logits.full_tensor() if isinstance(logits, DTensor) else logits
            chosen = choose(logits[:, -1, :self.vocab_size].float())
        else:
            chosen = torch.empty(batch, dtype=torch.int64, device=self.device)
        if self.pp_group is not None:
            dist.broadcast(chosen, src=self._global_rank(self.pp - 1), group=self.pp_group)
        return chosen
