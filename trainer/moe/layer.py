"""`MoELayer`: a drop-in replacement of a family's feed-forward layer by a router and E experts.

    layer = MoELayer(hidden_size=64, ffn_hidden_size=256, activation="gelu",
                     settings=MoESettings(num_experts=8, top_k=2, aux_loss_coeff=0.01))
    y = layer(x)  # x, y: [batch, seq, hidden]

Forward: router logits (float32) -> top-k -> (capacity dropping) -> tokens sorted by expert -> (under
expert parallelism: all-to-all to the experts' ranks) -> grouped GEMM -> back -> gated sum per token.
The load-balancing and z-losses join the backward pass through the output (`trainer.optim.auxiliary_losses`), and the
layer reports them with the dropped fraction and the expert loads (`auxiliary_metric_kinds`).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from trainer.optim.auxiliary_losses import MAX, MEAN, MIN, AuxiliaryMetric, attach_auxiliary_loss
from trainer.moe.dispatch import (
    capacity_keep_mask,
    combine,
    expert_capacity,
    plan_dispatch,
    receive_from_experts,
    send_to_experts,
)
from trainer.moe.experts import GroupedExperts
from trainer.moe.router import (
    Router,
    Routing,
    expert_counts,
    load_balancing_loss,
    per_sequence,
    route,
    z_loss,
)
from trainer.moe.settings import MoESettings

AUX_LOSS, Z_LOSS = "moe_aux_loss", "moe_z_loss"
DROPPED_FRACTION = "moe_dropped_fraction"
MAX_LOAD, MIN_LOAD = "moe_max_expert_load", "moe_min_expert_load"
METRIC_KINDS = {AUX_LOSS: MEAN, Z_LOSS: MEAN, DROPPED_FRACTION: MEAN, MAX_LOAD: MAX, MIN_LOAD: MIN}
"""Aux and z-loss: per layer and micro-batch, coefficient included (their sum over layers is what the loss
gains). Dropped fraction: of all assignments. Loads: assignments an expert's router sent it over the
balanced share (T k / E), before dropping; the extremes over experts, layers and micro-batches."""
PER_LAYER_METRICS = (AUX_LOSS, Z_LOSS)
"""What --moe-per-layer-logging also reports per layer (Megatron's per-layer load-balancing and z-losses)."""
ASSIGNMENTS = "assignments"
RECORD_FIELDS = (AUX_LOSS, Z_LOSS, DROPPED_FRACTION, ASSIGNMENTS, MAX_LOAD, MIN_LOAD)
"""The columns of one forward's record: the metrics, the dropped count over ``assignments`` (T k)."""


def _recomputing() -> bool:
    """True inside the backward pass: activation checkpointing re-running this forward (not a new one)."""
    return torch._C._current_graph_task_id() != -1


class MoELayer(nn.Module):
    """Router and experts; parameters ``router.weight`` [E, hidden], ``experts.w1.weight`` [E, hidden, ffn],
    ``experts.w2.weight`` [E, ffn, hidden] (and ``experts.w3.weight`` for a gated activation)."""

    compile_parts_only = True
    """`trainer.parallel.parallelize.apply_compile` compiles the router, not this forward: the token dispatch has
    data-dependent sizes (tokens per expert, capacity drops, the all-to-all's splits)."""

    def __init__(self, hidden_size: int, ffn_hidden_size: int, activation: str, settings: MoESettings) -> None:
        super().__init__()
        self.settings = settings
        self.router = Router(hidden_size, settings.num_experts, settings.router_dtype)
        self.experts = GroupedExperts(settings.num_experts, hidden_size, settings.expert_width(ffn_hidden_size),
                                      activation)
        self.layer_name = ""
        """Its name in the model (`name_moe_layers`): what --moe-per-layer-logging reports it under."""
        self.ep_group: dist.ProcessGroup | None = None
        """Set by `trainer.moe.parallel.apply_ep`: the experts are sharded over this group's ranks."""
        self.context_parallel: Any = None
        """Set by `trainer.parallel.context.apply_cp` (a ``ContextParallel``): this rank routes its share of each
        sequence, and the load-balancing statistics (tokens per expert) are summed over its ``group``, so the
        auxiliary losses and loads are the whole sequence's (Megatron reduces them over its tp x cp group; here the
        tp ranks route the same tokens already: `trainer.moe.parallel.replicated_moe_plan`)."""
        self.auxiliary_loss_scale = 1.0
        self._records: list[torch.Tensor] = []
        """One `_record` per training forward pass (recomputations excluded)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., hidden] -> [..., hidden] (zero for the tokens whose every assignment was dropped)."""
        s = self.settings
        tokens = x.reshape(-1, x.shape[-1])
        logits = self.router(self._jitter(tokens))
        routing = route(logits, s.top_k, s.pre_softmax)
        counts = expert_counts(routing.experts, s.num_experts)
        whole_counts = self._whole_sequence(counts)
        keep = None
        if s.capacity_factor is not None:
            capacity = expert_capacity(len(tokens), s.top_k, s.num_experts, s.capacity_factor)
            keep = capacity_keep_mask(routing.experts, s.num_experts, capacity)
        elif s.expert_capacity is not None:  # per sequence: the rows of x's [..., seq, hidden]
            sequences = len(tokens) // x.shape[-2] if x.dim() > 2 else 1
            keep = capacity_keep_mask(routing.experts, s.num_experts, s.expert_capacity, groups=sequences)
        dispatch = plan_dispatch(routing.experts, routing.weights, keep, s.num_experts)
        # index_select, not tokens[index]: a faster gather, and its backward (an index_add) is faster than
        # the accumulating index_put of tokens[index]'s (measured on the CPU; the same sums, row by row).
        rows = tokens.index_select(0, dispatch.token_index)
        if self.ep_group is None:
            outputs = self.experts(rows, dispatch.counts)
        else:
            received, local_counts, exchange = send_to_experts(rows, dispatch.counts, self.ep_group)
            outputs = receive_from_experts(self.experts(received, local_counts), exchange, self.ep_group)
        out = combine(outputs, dispatch, len(tokens)).view_as(x)
        aux = self._load_balancing_loss(routing, whole_counts, x)
        z = s.z_loss_coeff * z_loss(logits) if s.z_loss_coeff else logits.new_zeros(())
        if self.training:
            out = attach_auxiliary_loss(out, aux + z, self.auxiliary_loss_scale)
        # Training forwards only: the metrics are the training step's, and an evaluation or a generation
        # (forwards nobody pops) must not pile records up.
        if self.training and not _recomputing():
            assignments = len(tokens) * s.top_k
            self._record(aux, z, whole_counts, assignments, assignments - len(dispatch.token_index))
        return out

    def _load_balancing_loss(self, routing: Routing, whole_counts: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """The weighted load-balancing loss of the settings' kind (a zero coefficient or kind none skips it, and
        its backward: its reported value is zero either way). ``whole_counts``: `_whole_sequence` of the counts.

        Under context parallelism the fractions f_e are the whole sequence's and P_e this rank's tokens' mean:
        cp times this rank's share of the whole sequence's loss, as the main loss on a cp rank is
        (`trainer.parallel.context.context_parallel_loss`), so the gradients averaged over the cp ranks and the
        mean of the reported values are the whole sequence's."""
        s = self.settings
        if not s.aux_loss_coeff or s.load_balancing_type == "none":
            return routing.probs.new_zeros(())
        probs, counts = routing.probs, whole_counts
        if s.load_balancing_type == "seq_aux_loss":
            sequences = routing.probs.shape[0] // x.shape[-2] if x.dim() > 2 else 1
            probs, counts = per_sequence(routing.probs, routing.experts, sequences)
            counts = self._whole_sequence(counts)
        return s.aux_loss_coeff * load_balancing_loss(probs, counts, s.top_k,
                                                      counted_tokens=probs.shape[-2] * self._cp_size())

    def _cp_size(self) -> int:
        return 1 if self.context_parallel is None else dist.get_world_size(self.context_parallel.group)

    def _whole_sequence(self, counts: torch.Tensor) -> torch.Tensor:
        """``counts`` (int64 assignments per expert of this rank's tokens) summed over the cp group: the whole
        sequences' (``counts`` itself without context parallelism)."""
        if self.context_parallel is None:
            return counts
        whole = counts.clone()
        dist.all_reduce(whole, group=self.context_parallel.group)
        return whole

    def _jitter(self, tokens: torch.Tensor) -> torch.Tensor:
        """The router's input: ``tokens`` times uniform(1 - eps, 1 + eps) noise in training (``input_jitter_eps``)."""
        eps = self.settings.input_jitter_eps
        if not self.training or not eps:
            return tokens
        return tokens * torch.empty_like(tokens).uniform_(1.0 - eps, 1.0 + eps)

    def _record(self, aux: torch.Tensor, z: torch.Tensor, whole_counts: torch.Tensor, assignments: int,
                dropped: int) -> None:
        """Keep this forward's metrics as one float64 tensor [len(RECORD_FIELDS)] on the layer's device: no
        host synchronisation per forward (`pop_auxiliary_metrics` reads them all at once). The loads come from
        ``whole_counts`` (the whole sequences', `_whole_sequence`); ``assignments`` and ``dropped`` are this
        rank's (their sums over the ranks make the dropped fraction)."""
        load = whole_counts.double() * (whole_counts.numel() / whole_counts.sum().clamp(min=1).double())
        self._records.append(torch.stack([aux.detach().double(), z.detach().double(),
                                          torch.full_like(load[0], dropped), torch.full_like(load[0], assignments),
                                          load.max(), load.min()]))

    def auxiliary_metric_kinds(self) -> dict[str, str]:
        kinds = dict(METRIC_KINDS)
        if self.settings.per_layer_logging:
            kinds |= {per_layer_name(name, self.layer_name): MEAN for name in PER_LAYER_METRICS}
        return kinds

    def pop_auxiliary_metrics(self, last_forwards: int | None = None) -> dict[str, AuxiliaryMetric]:
        """The records of this layer's last ``last_forwards`` forward passes (all if None) since the last call,
        merged per metric; everything recorded is forgotten."""
        kept = self._records if last_forwards is None else self._records[max(0, len(self._records) - last_forwards):]
        self._records = []
        if not kept:
            return {}
        rows = torch.stack(kept).tolist()  # the one host read of these records
        column = {field: [row[i] for row in rows] for i, field in enumerate(RECORD_FIELDS)}
        weights = {AUX_LOSS: len(rows), Z_LOSS: len(rows), DROPPED_FRACTION: sum(column[ASSIGNMENTS])}
        merged: dict[str, AuxiliaryMetric] = {}
        for name, kind in METRIC_KINDS.items():
            if kind == MEAN:
                merged[name] = AuxiliaryMetric(sum(column[name]), float(weights[name]))
            else:
                merged[name] = AuxiliaryMetric((max if kind == MAX else min)(column[name]))
        if self.settings.per_layer_logging:
            for name in PER_LAYER_METRICS:
                merged[per_layer_name(name, self.layer_name)] = AuxiliaryMetric(sum(column[name]), float(len(rows)))
        return merged


def per_layer_name(metric: str, layer_name: str) -> str:
    """The name --moe-per-layer-logging reports one layer's ``metric`` under: ``moe_aux_loss/layers.1.feed_forward``."""
    return f"{metric}/{layer_name}"


def name_moe_layers(model: nn.Module) -> None:
    """Give each `MoELayer` of ``model`` its qualified name in it (`MoELayer.layer_name`)."""
    for name, module in model.named_modules():
        if isinstance(module, MoELayer):
            module.layer_name = name
