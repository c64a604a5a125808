"""This rank's share of the GPT for generation and scoring: a pipeline stage, tensor-parallel, in eval mode.

It reuses the trainer's pieces (`split_stage`, `apply_tp` without sequence parallelism,
`trainer.moe.parallel.apply_ep` for a MoE GPT's experts, the trainer's mesh) and moves hidden states
between pipeline stages with plain point-to-point sends in a fixed order, which gloo runs on CPU. The last
stage keeps the final norm and the output head apart from its blocks and applies them only to the positions
that are read: the last one while decoding
(the next tokens, broadcast over the pipeline group so every rank leaves `next_tokens` with the same
ids), the scored ones in `ShardedGPT.score` (evaluation: each scored position's log-probability of its
target, the log-softmax taken over the vocabulary shards without gathering them, `vocab_parallel_scores`,
a bounded number of rows at a time).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor

from trainer.generation.head import PretransposedHead
from trainer.generation.kv_cache import KVCache
from trainer.generation.layout import GenerationLayout
from trainer.models.gpt.model import GPT, TIED_COPY_NAME, TIED_WEIGHT_NAME, GPTShape
from trainer.models.gpt.parallelize import apply_tp
from trainer.models.gpt.pipeline import split_stage
from trainer.moe.parallel import apply_ep

# Logit elements (float32) one scoring step holds per rank: the head and log-softmax run over the scored
# rows in chunks of about 16 MiB rather than over [rows, vocab] at once (GPT-2's vocabulary at batch 8 x
# 1024 positions would be 1.6 GB of logits, plus as much again for the log-softmax); ~83 rows of GPT-2's
# 50257 columns per chunk. On CPU (one thread, 4 x 256 GPT-2 shape, every position of 512 scored) this
# chunk gave ~3000 tokens/s against ~2300 in one pass, 2^21 and 2^24 elements ~2950 and ~2250.
SCORE_CHUNK_ELEMENTS = 1 << 22


def sharded_layout(shape: GPTShape, tp: int, pp: int, world_size: int, ep: int = 1) -> GenerationLayout:
    """The layout of a GPT generation run, checked (heads, MLP, positions and vocabulary split over tp,
    layers over pp, experts over ep).

    Raises:
        TrainConfigError: naming the size that does not divide.
    """
    split_by_tp = {"num_attention_heads": shape.num_attention_heads, "num_query_groups": shape.query_groups,
                   "ffn_hidden_size": shape.ffn_hidden_size,
                   "the checkpoint's padded vocabulary": shape.padded_vocab_size}
    if shape.position_embedding_type == "learned_absolute":  # the table's rows are split over tp
        split_by_tp["max_position_embeddings"] = shape.max_position_embeddings
    num_experts = shape.moe.num_experts if shape.moe is not None else None
    return GenerationLayout.resolve(tp, pp, world_size, split_by_tp, {"num_layers": shape.num_layers}, ep,
                                    num_experts)


class ShardedGPT:
    """This rank's pipeline stage of ``GPT(shape)``, sharded over the tp ranks (its experts over the ep ranks),
    ready to decode."""

    def __init__(self, shape: GPTShape, vocab_size: int, layout: GenerationLayout, mesh: DeviceMesh | None,
                 device: torch.device) -> None:
        """Build the stage on the meta device, split and shard it there, then allocate this rank's share on
        ``device`` (uninitialised: load the weights next)."""
        self.vocab_size = vocab_size
        self.device = device
        self.tp = layout.tp
        with torch.device("meta"):
            model = GPT(shape)
        self.pp_rank = mesh.get_local_rank("pp") if mesh is not None else 0
        self.stage = split_stage(model, self.pp_rank, layout.pp) if layout.pp > 1 else model
        if layout.tp > 1:
            apply_tp(self.stage, mesh["tp"], sequence_parallel=False)
        if layout.ep > 1:  # before allocating: each rank only ever holds its experts
            apply_ep(self.stage, mesh["ep"])
        self.stage.to_empty(device=device)
        self.stage.tie_weights()  # to_empty gives a tied head a tensor of its own
        self.stage.eval()
        self.is_first, self.is_last = self.pp_rank == 0, self.pp_rank == layout.pp - 1
        self.pp_group = mesh.get_group("pp") if layout.pp > 1 else None
        self.dp_group = mesh.get_group("dp") if mesh is not None and layout.dp > 1 else None
        self.dp_rank = mesh.get_local_rank("dp") if mesh is not None else 0
        self.ep_group = mesh.get_group("ep") if layout.ep > 1 else None
        """The ranks this one's MoE layers exchange tokens with (None without expert parallelism)."""
        # The last stage's final norm and head, moved out of the stage by `finish_loading`.
        self.final_norm: nn.Module | None = None
        self.head: nn.Module | None = None

    def named_parameters(self) -> list[tuple[str, nn.Parameter]]:
        """Parameters under full-model names (a last stage's tied head copy is ``tok_embeddings.weight``)."""
        named = []
        for name, param in self.stage.named_parameters():
            tied_copy = self.stage.shape.tied and self.stage.tok_embeddings is None
            named.append((TIED_WEIGHT_NAME if name == TIED_COPY_NAME and tied_copy else name,
                          param))
        return named

    def finish_loading(self) -> None:
        """Call once the weights are in place, before `next_tokens` or `score`: the last stage's final norm
        and head move out of the stage (which then returns hidden states, so the head runs on the positions
        read only), and on CPU a plain (not tensor-parallel) head becomes a `PretransposedHead` copy;
        parameters are not to be loaded again afterwards."""
        if not self.is_last or self.head is not None:
            return
        head, self.final_norm = self.stage.output, self.stage.norm
        self.stage.output = self.stage.norm = None
        if self.device.type == "cpu" and isinstance(head, nn.Linear) and not isinstance(head.weight, DTensor):
            head = PretransposedHead(head.weight)
        self.head = head

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """The last stage's final norm and head: hidden states [..., hidden] -> logits [..., padded vocab]
        (a DTensor sharded on its last dim under tensor parallelism)."""
        return self.head(self.final_norm(h))

    def _hidden_states(self, tokens: torch.Tensor, positions: torch.Tensor, cache: KVCache | None) -> torch.Tensor:
        """This stage's blocks over a batch (receiving from the previous stage, sending to the next):
        float [batch, n, hidden], before the final norm."""
        batch, n = tokens.shape
        if self.is_first:
            h = self.stage(tokens, positions, kv_cache=cache)
        else:
            h = torch.empty(batch, n, self.stage.shape.hidden_size, device=self.device)
            dist.recv(h, src=self._stage_rank(self.pp_rank - 1), group=self.pp_group)
            # Rotary positions of a left-padded batch (and of cached steps) are not 0..n-1 in every row.
            h = self.stage(h, positions, kv_cache=cache)
        if not self.is_last:
            dist.send(h.contiguous(), dst=self._stage_rank(self.pp_rank + 1), group=self.pp_group)
        return h

    def _broadcast_from_last(self, *tensors: torch.Tensor) -> None:
        """The last stage's values of ``tensors`` on every rank of the pipeline (in place)."""
        if self.pp_group is not None:
            last = self._stage_rank(dist.get_world_size(self.pp_group) - 1)
            for tensor in tensors:
                dist.broadcast(tensor, src=last, group=self.pp_group)

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
        h = self._hidden_states(tokens, positions, cache)
        if self.is_last:
            logits = self.logits(h[:, -1])
            logits = logits.full_tensor() if isinstance(logits, DTensor) else logits
            chosen = choose(logits[:, :self.vocab_size].float())
        else:
            chosen = torch.empty(tokens.shape[0], dtype=torch.int64, device=self.device)
        self._broadcast_from_last(chosen)
        return chosen

    @torch.no_grad()
    def score(self, tokens: torch.Tensor, positions: torch.Tensor, targets: torch.Tensor, scored: torch.Tensor,
              greedy: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """Teacher-forced scores of a batch's scored positions: each one's log-probability of its target,
        and whether the target is the model's greedy choice there (collective over the model's tp and pp
        ranks). The final norm and head run on the scored positions only.

        Args:
            tokens: int64 [batch, n] input ids (read by the first stage only).
            positions: int64 [batch, n] their position ids.
            targets: int64 [batch, n] the id each position should predict (any valid id where unscored).
            scored: bool [batch, n] the positions that count (the same on every rank).
            greedy: find the argmax too (a pass over the logits that perplexity does without).

        Returns:
            (float32 [scored positions] log-probabilities, bool [scored positions] greedy hits: all False
            without ``greedy``), in row-major order of ``scored``, identical on every rank of the pipeline.
        """
        h = self._hidden_states(tokens, positions, None)
        count = int(scored.sum())
        if self.is_last:
            log_probs, hits = self._score_hidden(h[scored], targets[scored], greedy)
            hits = hits.to(torch.uint8)  # gloo broadcasts no bool tensors
        else:
            log_probs = torch.empty(count, device=self.device)
            hits = torch.empty(count, dtype=torch.uint8, device=self.device)
        self._broadcast_from_last(log_probs, hits)
        return log_probs, hits.bool()

    def _score_hidden(self, h: torch.Tensor, targets: torch.Tensor, greedy: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """`vocab_parallel_scores` of hidden states [rows, hidden] against targets int64 [rows], the head
        applied to `SCORE_CHUNK_ELEMENTS` logits at a time (every tp rank takes the same chunks)."""
        local_vocab = self.stage.shape.padded_vocab_size // self.tp  # a tensor-parallel head is split over tp
        step = max(1, SCORE_CHUNK_ELEMENTS // local_vocab)
        parts = [vocab_parallel_scores(self.logits(h[start:start + step]), targets[start:start + step],
                                       self.vocab_size, greedy) for start in range(0, len(h), step)]
        if not parts:
            return torch.empty(0, device=self.device), torch.empty(0, dtype=torch.bool, device=self.device)
        return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])


def vocab_parallel_scores(logits: torch.Tensor, targets: torch.Tensor, vocab_size: int, greedy: bool = True
                          ) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probabilities of ``targets`` and whether each is the greedy (argmax) choice, over the real
    vocabulary: the padded rows of the head never count.

    Under tensor parallelism ``logits`` is a DTensor sharded over the vocabulary (the head's layout):
    each rank reduces its own shard (its log-sum-exp, its best id, its slice of the target logit) and
    three small all-reduces over the tp group combine them, so the full [..., vocab] logits are
    never gathered. Ties in the argmax go to the lowest id, as ``torch.argmax`` does.

    Args:
        logits: [..., padded_vocab] (a plain tensor, or a DTensor sharded on its last dim).
        targets: int64 [...], ids in [0, vocab_size).
        vocab_size: the real vocabulary (columns at or past it are padding).
        greedy: find the argmax (else the hits are all False, and one pass over the logits is saved).

    Returns:
        (float32 log-probabilities [...], bool greedy hits [...]).
    """
    group = None
    if isinstance(logits, DTensor):
        mesh = logits.device_mesh
        group, local = mesh.get_group(), logits.to_local()
        start = mesh.get_local_rank() * local.shape[-1]
    else:
        local, start = logits, 0
    # A slice (a view): the padding columns of this shard are simply not looked at.
    local = local[..., :max(0, min(local.shape[-1], vocab_size - start))].float()
    width = local.shape[-1]
    no_hits = torch.zeros(targets.shape, dtype=torch.bool, device=local.device)
    if group is None:
        # One fused log-softmax + gather (on CPU ~20% faster than logsumexp and a gather apart).
        log_probs = -F.cross_entropy(local.flatten(0, -2), targets.flatten(), reduction="none").view(targets.shape)
        return log_probs, (local.argmax(dim=-1) == targets if greedy else no_hits)
    if width:
        shard_lse = torch.logsumexp(local, dim=-1)
        if greedy:
            shard_max, shard_arg = local.max(dim=-1)
    else:  # a shard made only of padding rows
        shard_lse = shard_max = torch.full(targets.shape, -torch.inf, device=local.device)
        shard_arg = torch.zeros(targets.shape, dtype=torch.int64, device=local.device)
    in_shard = (targets >= start) & (targets < start + width)
    target_logit = torch.zeros(targets.shape, device=local.device)
    if width:
        picked = local.gather(-1, (targets - start).clamp(0, width - 1)[..., None])[..., 0]
        target_logit = torch.where(in_shard, picked, target_logit)
    # log-sum-exp of the shards' log-sum-exps, shifted by their maximum for range.
    top_lse = shard_lse.clone()
    dist.all_reduce(top_lse, op=dist.ReduceOp.MAX, group=group)
    total = torch.exp(shard_lse - top_lse)
    dist.all_reduce(total, op=dist.ReduceOp.SUM, group=group)
    dist.all_reduce(target_logit, op=dist.ReduceOp.SUM, group=group)
    log_probs = target_logit - (top_lse + torch.log(total))
    if not greedy:
        return log_probs, no_hits
    best = shard_max.clone()
    dist.all_reduce(best, op=dist.ReduceOp.MAX, group=group)
    # The lowest id holding the global maximum: shards without it offer an id past every real one.
    argmax = torch.where(shard_max == best, shard_arg + start, torch.full_like(shard_arg, vocab_size))
    dist.all_reduce(argmax, op=dist.ReduceOp.MIN, group=group)
    return log_probs, argmax == targets
