"""Megatron's kernel, overlap, attention-backend and MoE flags: each does what Megatron's does, or is accepted
because its every value computes what this trainer computes anyway (``--help`` says so and why: one
mechanism, `trainer.config.flag`'s ``same_math``), or is refused in one line that says why.

Promised:
- the same-math switches (fusion switches, ``--use-mcore-models``, ``--transformer-impl local``,
  ``--init-model-with-meta-device``, ``--empty-unused-memory-level``, ``--log-throughput``, ``--use-pytorch-profiler``,
  ``--moe-grouped-gemm``, ``--moe-token-dispatcher-type``, ``--moe-permute-fusion``) parse, are documented as
  changing nothing, and a run given all of them has the losses of a run without; ``--transformer-impl
  transformer_engine`` is one line;
- ``--attention-backend`` holds torch's SDPA to its kernels (flash: the flash kernel; unfused/local: the math
  kernel); one the device lacks (fused on a CPU) is one line; ``--use-flash-attn`` is ``flash``;
- ``--overlap-grad-reduce``/``--overlap-param-gather`` follow Megatron's rules; where the layout reduces/gathers
  outside the backward/forward pass (the same result), the run goes on with one warning saying so, so that
  Megatron's example scripts run unchanged;
- ``--moe-router-load-balancing-type seq_aux_loss`` is Megatron's sequence-level loss, ``none`` has none;
  ``--moe-router-dtype fp64`` routes in float64; ``--moe-ffn-hidden-size`` sizes the experts;
  ``--moe-per-layer-logging`` reports each layer's losses under its own name.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from trainer.cli.train_args import _sections, build_parser, config_from_args
from trainer.config import KernelConfig, MoEConfig, ObservabilityConfig, ParallelismConfig, TrainConfig
from trainer.errors import TrainConfigError
from trainer.models import model_spec
from trainer.moe.layer import MoELayer, name_moe_layers
from trainer.moe.router import load_balancing_loss, per_sequence
from trainer.moe.settings import MoESettings
from trainer.parallel.attention_backend import attention_kernels
from trainer.parallel.dims import overlap_notes, resolve_parallel_dims
from trainer_testing import argv_for, result_record, tiny_config, train_in_process

STEPS = 3
# (flag words, config section, field): every same-math switch (`flag(..., same_math=...)`).
SAME_MATH = [
    (["--no-masked-softmax-fusion"], "kernels", "no_masked_softmax_fusion"),
    (["--no-bias-gelu-fusion"], "kernels", "no_bias_gelu_fusion"),
    (["--no-bias-dropout-fusion"], "kernels", "no_bias_dropout_fusion"),
    (["--no-gradient-accumulation-fusion"], "kernels", "no_gradient_accumulation_fusion"),
    (["--no-rope-fusion"], "kernels", "no_rope_fusion"),
    (["--cross-entropy-loss-fusion"], "kernels", "cross_entropy_loss_fusion"),
    (["--use-mcore-models"], "kernels", "use_mcore_models"),
    (["--transformer-impl", "local"], "kernels", "transformer_impl"),
    (["--init-model-with-meta-device"], "kernels", "init_model_with_meta_device"),
    (["--empty-unused-memory-level", "2"], "kernels", "empty_unused_memory_level"),
    (["--log-throughput"], "observability", "log_throughput"),
    (["--use-pytorch-profiler"], "observability", "use_pytorch_profiler"),
    (["--moe-grouped-gemm"], "moe", "moe_grouped_gemm"),
    (["--moe-token-dispatcher-type", "alltoall"], "moe", "moe_token_dispatcher_type"),
    (["--moe-permute-fusion"], "moe", "moe_permute_fusion"),
    (["--attention-softmax-in-fp32"], "precision", "attention_softmax_in_fp32"),
    (["--num-workers", "4"], "data", "num_workers"),
]


def parse(argv: list[str]) -> TrainConfig:
    return config_from_args(build_parser().parse_args(argv))


def test_every_same_math_switch_is_in_this_table_and_says_so_in_help():
    declared = {f.name for _, section in _sections() for f in dataclasses.fields(section)
                if f.metadata.get("same_math")}
    assert declared == {name for _, _, name in SAME_MATH}
    helps = {action.dest: " ".join((action.help or "").split()) for action in build_parser()._actions}
    for _, _, name in SAME_MATH:
        assert "Accepted for Megatron's scripts; changes nothing here:" in helps[name], name


@pytest.mark.parametrize(("words", "section", "name"), SAME_MATH)
def test_a_same_math_switch_parses(words, section, name):
    moe = ["--num-experts", "2"] if section == "moe" else []
    config = parse(["--dataset", "p", *moe, *words])
    value = getattr(getattr(config, section), name)
    assert value is True or str(value) == words[-1]


def test_a_run_given_every_same_math_switch_has_the_same_losses(reference, tiny_prefix, cache_dir):
    config = tiny_config(tiny_prefix, cache_dir, train_iters=STEPS)
    config.kernels = KernelConfig(**{name: True for _, section, name in SAME_MATH
                                     if section == "kernels" and name not in ("transformer_impl",
                                                                              "empty_unused_memory_level")},
                                  empty_unused_memory_level=2)
    config.observability = ObservabilityConfig(log_throughput=True, use_pytorch_profiler=True)
    assert result_record(config)["losses"] == reference["losses"][:STEPS]


@pytest.mark.parametrize(("argv", "named"), [
    (["--transformer-impl", "transformer_engine"], "--transformer-impl transformer_engine: Transformer Engine"),
    (["--use-flash-attn", "--attention-backend", "unfused"], "--use-flash-attn means --attention-backend flash"),
    (["--attention-backend", "te"], "--attention-backend"),
    (["--empty-unused-memory-level", "3"], "--empty-unused-memory-level"),
    (["--overlap-param-gather"], "--overlap-param-gather needs --overlap-grad-reduce"),
    (["--overlap-param-gather", "--overlap-grad-reduce"], "--use-distributed-optimizer"),
    (["--moe-router-load-balancing-type", "none", "--moe-aux-loss-coeff", "0.01", "--num-experts", "2"],
     "--moe-router-load-balancing-type none has none"),
    (["--moe-router-dtype", "fp64"], "--moe-router-dtype needs --num-experts"),
    (["--moe-router-dtype", "bf16", "--num-experts", "2"], "--moe-router-dtype"),
])
def test_refused_values_are_one_line(argv, named, tmp_path, capsys):
    before = sorted(tmp_path.iterdir())
    code, lines = train_in_process(["--dataset", str(tmp_path / "missing"), "--device", "cpu", *argv], capsys)
    assert code != 0
    assert len(lines) == 1 and named in lines[0], lines
    assert sorted(tmp_path.iterdir()) == before


# -- attention backends ------------------------------------------------------------------------------------

class OpLog(TorchDispatchMode):
    """The aten ops that run (below the SDPA dispatcher: which kernel it picked)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def kernels_run(backend: str) -> list[str]:
    q = torch.randn(1, 2, 8, 8)
    with attention_kernels(backend, torch.device("cpu"), torch.float32), OpLog() as log:
        F.scaled_dot_product_attention(q, q, q, is_causal=True)
    return log.ops


def test_on_a_cpu_flash_runs_the_flash_kernel_and_unfused_or_local_the_math():
    assert any("flash_attention" in op for op in kernels_run("flash"))
    for backend in ("unfused", "local"):
        ops = kernels_run(backend)
        assert not any("flash" in op for op in ops) and any("softmax" in op for op in ops), ops


def test_a_kernel_the_device_lacks_is_one_line(tiny_prefix, cache_dir, capsys):
    with pytest.raises(TrainConfigError, match="attention_backend fused .* no such attention kernel .* on cpu"):
        with attention_kernels("fused", torch.device("cpu"), torch.float32):
            pass
    argv = argv_for(tiny_config(tiny_prefix, cache_dir, train_iters=1)) + ["--attention-backend", "fused"]
    code, lines = train_in_process(argv, capsys)
    assert code != 0 and len(lines) == 1, lines
    assert "--attention-backend fused" in lines[0] and "on cpu" in lines[0]


def test_use_flash_attn_is_attention_backend_flash_and_unfused_trains_to_the_same_losses(reference, tiny_prefix,
                                                                                         cache_dir):
    assert parse(["--dataset", "p", "--use-flash-attn"]).kernels.attention_backend == "flash"
    config = tiny_config(tiny_prefix, cache_dir, train_iters=STEPS)
    config.kernels = KernelConfig(attention_backend="unfused")
    # the math kernel sums in another order than the flash kernel: ulps apart
    assert result_record(config)["losses"] == pytest.approx(reference["losses"][:STEPS], rel=1e-5)


# -- overlap ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("parallelism", "world", "note"), [
    (dict(overlap_grad_reduce=True), 2, None),                                       # DDP: overlapped
    (dict(overlap_grad_reduce=True, overlap_param_gather=True, zero_stage=3), 2, None),  # FSDP2 prefetch
    (dict(overlap_grad_reduce=True, overlap_param_gather=True, zero_stage=2), 2, None),
    (dict(overlap_grad_reduce=True, tensor_model_parallel_size=2), 4, "averaged after the backward pass"),
    (dict(overlap_grad_reduce=True, overlap_param_gather=True, use_distributed_optimizer=True), 2,
     "all-gathers the parameters after the optimiser step"),
    (dict(overlap_grad_reduce=True, overlap_param_gather=True, use_distributed_optimizer=True), 1, None),
])
def test_overlap_is_silent_where_the_layout_overlaps_and_noted_elsewhere(parallelism, world, note,
                                                                         tiny_prefix, cache_dir):
    config = tiny_config(tiny_prefix, cache_dir)
    config.parallelism = ParallelismConfig(**parallelism)
    dims = resolve_parallel_dims(config, world, model_spec(config.model.model).layout_rules)  # never refused
    notes = overlap_notes(config.parallelism, dims.dp * dims.cp)
    if note is None:
        assert notes == []
    else:
        assert len(notes) == 1 and note in notes[0] and "same result" in notes[0]


# -- MoE -------------------------------------------------------------------------------------------------

def megatron_seq_aux_loss(probs_sbe: torch.Tensor, routing_map_sbe: torch.Tensor, top_k: int) -> torch.Tensor:
    """megatron-core 0.16's ``_apply_seq_aux_loss`` (coefficient 1), transcribed: tokens sequence-first
    [s, b, E]; the (sequence, expert) pairs are the "experts" of ``switch_load_balancing_loss_func`` over s
    tokens, and the sum over sequences is divided by b."""
    s, b, num_experts = probs_sbe.shape
    scores, routing_map = probs_sbe.reshape(s, -1), routing_map_sbe.reshape(s, -1)
    tokens_per_expert, total_num_tokens = routing_map.sum(dim=0), s
    aggregated = scores.sum(dim=0)
    loss = torch.sum(aggregated * tokens_per_expert) * num_experts / (total_num_tokens * total_num_tokens * top_k)
    return loss / b


def test_seq_aux_loss_is_megatrons_sequence_load_balancing_loss():
    torch.manual_seed(0)
    batch, seq, experts, top_k = 3, 5, 4, 2
    probs = torch.softmax(torch.randn(batch * seq, experts, dtype=torch.float64), dim=-1)  # batch-major tokens
    chosen = torch.topk(probs, top_k, dim=-1).indices
    routing_map = torch.zeros(batch * seq, experts, dtype=torch.float64).scatter_(1, chosen, 1.0)
    # What the MoE layer computes for seq_aux_loss (`MoELayer._load_balancing_loss`, without context parallelism).
    ours = load_balancing_loss(*per_sequence(probs, chosen, batch), top_k)
    sequence_first = (lambda t: t.view(batch, seq, experts).transpose(0, 1))
    assert torch.allclose(ours, megatron_seq_aux_loss(sequence_first(probs), sequence_first(routing_map), top_k))
    # one sequence: the whole-batch loss
    assert torch.allclose(load_balancing_loss(*per_sequence(probs, chosen, 1), top_k),
                          load_balancing_loss(probs, routing_map.sum(0).long(), top_k))


def moe_output_and_aux(settings: MoESettings) -> tuple[torch.Tensor, dict[str, float], MoELayer]:
    torch.manual_seed(0)
    layer = MoELayer(16, 32, "gelu", settings)
    for p in layer.parameters():
        torch.nn.init.normal_(p, std=0.2)
    layer.train()
    x = torch.randn(2, 6, 16, requires_grad=True)
    out = layer(x)
    out.square().mean().backward()
    metrics = {name: metric.value / metric.weight for name, metric in layer.pop_auxiliary_metrics().items()}
    return out.detach(), metrics, layer


def test_load_balancing_types_router_dtype_and_expert_width():
    base = MoESettings(num_experts=4, top_k=2, aux_loss_coeff=0.1)
    _, whole, _ = moe_output_and_aux(base)
    _, per_sequence, _ = moe_output_and_aux(dataclasses.replace(base, load_balancing_type="seq_aux_loss"))
    _, none, _ = moe_output_and_aux(dataclasses.replace(base, load_balancing_type="none"))
    assert whole["moe_aux_loss"] > 0 and per_sequence["moe_aux_loss"] > 0
    assert whole["moe_aux_loss"] != per_sequence["moe_aux_loss"]
    assert none["moe_aux_loss"] == 0.0
    out32, _, layer32 = moe_output_and_aux(base)
    out64, aux64, layer64 = moe_output_and_aux(dataclasses.replace(base, router_dtype="fp64"))
    assert layer64.router(torch.randn(3, 16)).dtype == torch.float64
    with torch.autocast("cpu", dtype=torch.bfloat16):  # fp32 means fp32 under autocast too
        assert layer32.router(torch.randn(3, 16)).dtype == torch.float32
        assert layer64.router(torch.randn(3, 16)).dtype == torch.float64
    assert out64.dtype == torch.float32 and torch.allclose(out32, out64, atol=1e-5)
    assert layer64.router.weight.grad is not None
    _, _, wide = moe_output_and_aux(dataclasses.replace(base, ffn_hidden_size=24))
    assert wide.experts.w1.weight.shape[-1] == 24 and wide.experts.w2.weight.shape[-2] == 24
    assert parse(["--dataset", "p", "--num-experts", "2", "--moe-ffn-hidden-size", "24"]).moe.moe_ffn_hidden_size == 24


def test_per_layer_logging_names_each_layer(tiny_prefix, cache_dir):
    settings = MoESettings(num_experts=4, aux_loss_coeff=0.1, per_layer_logging=True)
    model = torch.nn.ModuleDict({"0": MoELayer(16, 32, "gelu", settings), "1": MoELayer(16, 32, "gelu", settings)})
    name_moe_layers(model)
    assert set(model["1"].auxiliary_metric_kinds()) >= {"moe_aux_loss/1", "moe_z_loss/1"}
    config = tiny_config(tiny_prefix, cache_dir, num_layers=2, train_iters=1)
    config.moe = MoEConfig(num_experts=2, moe_aux_loss_coeff=0.01, moe_per_layer_logging=True,
                           moe_router_load_balancing_type="seq_aux_loss")
    auxiliary = result_record(config)["auxiliary"][0]
    per_layer = {name for name in auxiliary if "/" in name}
    assert per_layer == {f"{kind}/layers.{i}.feed_forward" for kind in ("moe_aux_loss", "moe_z_loss") for i in (0, 1)}
    assert auxiliary["moe_aux_loss"] == pytest.approx(sum(auxiliary[f"moe_aux_loss/layers.{i}.feed_forward"]
                                                          for i in (0, 1)) / 2)
