"""This rank's share of the GPT for generation: a pipeline stage, tensor-parallel, in eval mode.

It reuses the trainer's pieces (`split_stage`, `apply_tp` without sequence parallelism, the
``(pp, dp, tp)`` mesh) and moves hidden states between pipeline stages with plain point-to-point
sends in a fixed order, which gloo runs on CPU. The last stage picks the next tokens and broadcasts
them over its pipeline group, so every rank leaves `next_tokens` with the same ids.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import DTensor

from trainer.errors import TrainConfigError
from trainer.generation.kv_cache import KVCache
from trainer.models.gpt.model import GPT, GPTShape
from trainer.parallel_dims import MESH_DIM_NAMES
from trainer.models.gpt.parallelize import apply_tp
from trainer.pipeline import split_stage
from trainer.runner import TIED_COPY_NAME, TIED_WEIGHT_NAME


@dataclass(frozen=True, slots=True)
class GenerationLayout:
    """Tensor-, pipeline- and (derived) data-parallel degrees of a generation run."""

    tp: int
    pp: int
    dp: int

    @classmethod
    def resolve(cls, shape: GPTShape, tp: int, pp: int, world_size: int) -> GenerationLayout:
        """Check that ``shape`` splits over tp x pp and that the world is a multiple of it.

        Raises:
            TrainConfigError: naming the sizes that do not divide.
        """
        tp_name, pp_name = f"tensor_model_parallel_size ({tp})", f"pipeline_model_parallel_size ({pp})"
        rules = [(world_size % (tp * pp) == 0, f"world size {world_size} is not divisible by {tp_name} x {pp_name}"),
                 (shape.num_attention_heads % tp == 0,
                  f"num_attention_heads ({shape.num_attention_heads}) is not divisible by {tp_name}"),
                 (shape.ffn_hidden_size % tp == 0, f"ffn_hidden_size ({shape.ffn_hidden_size}) is not divisible by "
                                                   f"{tp_name}"),
                 (shape.max_position_embeddings % tp == 0,
                  f"max_position_embeddings ({shape.max_position_embeddings}) is not divisible by {tp_name}"),
                 (shape.padded_vocab_size % tp == 0,
                  f"the checkpoint's padded vocabulary ({shape.padded_vocab_size}) is not divisible by {tp_name}"),
                 (shape.num_layers % pp == 0, f"num_layers ({shape.num_layers}) is not divisible by {pp_name}")]
        for ok, message in rules:
            if not ok:
                raise TrainConfigError(message)
        return cls(tp=tp, pp=pp, dp=world_size // (tp * pp))

    def build_mesh(self, device_type: str) -> DeviceMesh | None:
        """The trainer's ``(pp, dp, tp)`` mesh, or None in a single process."""
        if self.tp * self.pp * self.dp == 1:
            return None
        return init_device_mesh(device_type, (self.pp, self.dp, self.tp), mesh_dim_names=MESH_DIM_NAMES)


class PretransposedHead(nn.Module):
    """The output head as ``h @ W.T`` with ``W.T`` stored contiguous (a decoding-only copy).

    While decoding, the head is a matrix-vector product over the whole vocabulary. On CPU that is
    where ``F.linear`` is slowest: GPT-2's 50257 x 768 head at batch 1 on one thread takes ~12 ms
    through ``F.linear`` and ~6 ms against a contiguous transpose (about a quarter of a GPT-2-small
    step; benchmarks/generate.py times the whole loop).
    """

    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("weight_t", weight.detach().t().contiguous(), persistent=False)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h @ self.weight_t


class ShardedGPT:
    """This rank's pipeline stage of ``GPT(shape)``, sharded over the tp ranks, ready to decode."""

    def __init__(self, shape: GPTShape, vocab_size: int, layout: GenerationLayout, mesh: DeviceMesh | None,
                 device: torch.device) -> None:
        self.vocab_size = vocab_size
        self.device = device
        with torch.device(device):
            model = GPT(shape)
        self.pp_rank = mesh.get_local_rank("pp") if mesh is not None else 0
        self.stage = split_stage(model, self.pp_rank, layout.pp) if layout.pp > 1 else model
        if layout.tp > 1:
            apply_tp(self.stage, mesh["tp"], sequence_parallel=False)
        self.stage.eval()
        self.is_first, self.is_last = self.pp_rank == 0, self.pp_rank == layout.pp - 1
        self.pp_group = mesh.get_group("pp") if layout.pp > 1 else None
        self.dp_group = mesh.get_group("dp") if mesh is not None and layout.dp > 1 else None
        self.dp_rank = mesh.get_local_rank("dp") if mesh is not None else 0

    def named_parameters(self) -> list[tuple[str, nn.Parameter]]:
        """Parameters under full-model names (a last stage's tied head copy is ``tok_embeddings.weight``)."""
        named = []
        for name, param in self.stage.named_parameters():
            named.append((TIED_WEIGHT_NAME if name == TIED_COPY_NAME and self.stage.tok_embeddings is None else name,
                          param))
        return named

    def finish_loading(self) -> None:
        """Call once the weights are in place: on CPU, a plain (not tensor-parallel) head becomes a
        `PretransposedHead` copy; parameters are not to be loaded again afterwards."""
        head = self.stage.output
        if self.device.type == "cpu" and isinstance(head, nn.Linear) and not isinstance(head.weight, DTensor):
            self.stage.output = PretransposedHead(head.weight)

    def _stage_rank(self, pp_rank: int) -> int:
        return dist.get_global_rank(self.pp_group, pp_rank)

    @torch.no_grad()
    def next_tokens(self, tokens: torch.Tensor, positions: torch.Tensor, cache: KVCache,
                    choose: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """Run ``tokens``/``positions`` (int64 [batch, n]) through the model and return the next tokens.

        Args:
            tokens: token ids [batch, n] (read by the first stage only).
            positions: their position ids [batch, n].
            cache: the KV cache, already advanced with ``cache.step(n)``.
            choose: float logits [batch, vocab] -> int64 tokens [batch] (run on the last stage).

        Returns:
            int64 [batch], identical on every rank of the pipeline.
        """
        batch, n = tokens.shape
        if self.is_first:
            h = self.stage(tokens, positions, kv_cache=cache)
        else:
            h = torch.empty(batch, n, self.stage.shape.hidden_size, device=self.device)
            dist.recv(h, src=self._stage_rank(self.pp_rank - 1), group=self.pp_group)
            h = self.stage(h, None, kv_cache=cache)
        if not self.is_last:
            dist.send(h.contiguous(), dst=self._stage_rank(self.pp_rank + 1), group=self.pp_group)
            chosen = torch.empty(batch, dtype=torch.int64, device=self.device)
        else:
            logits = h.full_tensor() if isinstance(h, DTensor) else h
            chosen = choose(logits[:, -1, :self.vocab_size].float())
        if self.pp_group is not None:
            dist.broadcast(chosen, src=self._stage_rank(dist.get_world_size(self.pp_group) - 1), group=self.pp_group)
        return chosen
