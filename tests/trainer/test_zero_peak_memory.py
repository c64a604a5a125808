"""`trainer.metrics.memory_report.StepStateSampler`: the model-state bytes a rank holds at each point of a training
step (end of forward, end of backward, before and after the optimiser step) at ZeRO stages 2 and 3 over
DP 2 equal the sizes computed here from the model's parameter shapes (built on the meta device), in fp32
and under bf16 autocast (FSDP2 gathers bf16 weights, which autocast does not cast again); in one process, a plain
loop is sampled at those four points only, autocast's casts count once per weight (once per use without its
cache), and a forward under autocast holds them at its end and no longer at the end of backward.

By hand, for the model below (GPT, vocab 256, hidden 16, 1 layer, 32 positions, tied head):
    Ψ = 256·16 (tokens) + 32·16 (positions)
        + [2·16 + 4·(16·16 + 16) + 2·16 + (64·16 + 64) + (16·64 + 16)] (the layer) + 2·16 (final norm)
      = 4096 + 512 + 3280 + 32 = 7920 parameters in T = 20 tensors.
    Stage 2, fp32, the end of forward (the step's peak): FSDP2 (reshard_after_forward=False) holds every
    gathered weight, 4Ψ = 31,680 bytes, beside the rank's fp32 shards, 4Ψ/2 = 15,840, and AdamW's two moments
    of the shards, 2·4Ψ/2 = 31,680, plus a float32 step per tensor, 4·20 = 80; no gradients yet:
    31,680 + 15,840 + 31,680 + 80 = 79,280 bytes, where the paper's 2Ψ + 14Ψ/N counts 5.5 bytes per
    parameter at N = 4, 9Ψ = 71,280 at N = 2.
"""

import dataclasses

import pytest
import torch
import torch.distributed as dist
from process_testing import run_jobs
from torch import nn
from trainer_testing import TINY_VOCAB, tiny_config

from trainer.config import PrecisionConfig
from trainer.parallel.runner import autocast_forward
from trainer.metrics.memory_report import (
    AFTER_STEP,
    BACKWARD_END,
    BEFORE_STEP,
    FORWARD_END,
    STEP_POINTS,
    StateSample,
    StepStateSampler,
    autocast_copy_bytes,
)
from trainer.models.gpt.model import GPT, GPTShape
from trainer.train import train

DP = 2
HIDDEN = 16
LAYERS = 1
SEQ = 32
STEPS = 2
FP32_BYTES = 4
BF16_BYTES = 2
STEP_BYTES = 4
MOMENTS = 2
# The by-hand figure of the module docstring.
STAGE2_FP32_PEAK_BY_HAND = 79_280
# (ZeRO stage, bf16) of each sampled run.
RUNS = [(2, False), (3, False), (2, True), (3, True)]


def sampled_run(config) -> list[list[dict]]:
    """Train ``config`` under a `StepStateSampler`: every rank's samples and peak (collective)."""
    with StepStateSampler(torch.device("cpu"), torch.bfloat16 if config.precision.bf16 else None) as sampler:
        train(config)
    gathered: list = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, {"samples": [dataclasses.asdict(s) for s in sampler.samples],
                                      "peak": dataclasses.asdict(sampler.peak())})
    return gathered


def run_config(prefix: str, cache: str, stage: int, bf16: bool):
    """The tiny model with one micro-batch per rank and step (no gradient accumulation)."""
    config = tiny_config(prefix, cache, train_iters=STEPS, num_layers=LAYERS, hidden_size=HIDDEN,
                         micro_batch_size=4)
    return dataclasses.replace(config, precision=PrecisionConfig(bf16=bf16),
                               parallelism=dataclasses.replace(config.parallelism, zero_stage=stage))


def model_parameters() -> dict[str, int]:
    """Element count of every parameter of the tiny GPT, from its definition on the meta device."""
    shape = GPTShape(num_layers=LAYERS, hidden_size=HIDDEN, num_attention_heads=4, ffn_hidden_size=4 * HIDDEN,
                     max_position_embeddings=SEQ, padded_vocab_size=TINY_VOCAB)
    with torch.device("meta"):
        return {name: p.numel() for name, p in GPT(shape).named_parameters()}


def expected_samples(stage: int, bf16: bool, sizes: dict[str, int]) -> dict[str, dict[str, int]]:
    """Each point's bytes on each rank at a step after the first (every dimension of the tiny model is even,
    so FSDP2's dim-0 shards are exact halves)."""
    psi = sum(sizes.values())
    shards = FP32_BYTES * psi // DP
    moments = MOMENTS * FP32_BYTES * psi // DP + STEP_BYTES * len(sizes)
    # Under bf16 FSDP2 gathers the weights cast to bf16 (`fsdp_options`), so autocast, finding them
    # in its dtype, caches no copies. Stage 2 keeps every gathered weight from forward to its backward; stage 3
    # reshards each unit (the root too) as soon as its forward ends.
    gathered = (BF16_BYTES if bf16 else FP32_BYTES) * psi if stage == 2 else 0
    return {
        FORWARD_END: {"parameters": shards + gathered, "gradients": 0, "optimizer": moments, "autocast_copies": 0},
        BACKWARD_END: {"parameters": shards, "gradients": shards, "optimizer": moments, "autocast_copies": 0},
        BEFORE_STEP: {"parameters": shards, "gradients": shards, "optimizer": moments, "autocast_copies": 0},
        AFTER_STEP: {"parameters": shards, "gradients": shards, "optimizer": moments, "autocast_copies": 0},
    }


@pytest.fixture(scope="module")
def sampled(tiny_prefix, cache_dir, workdir) -> dict:
    jobs = [(sampled_run, (run_config(tiny_prefix, cache_dir, stage, bf16),), {}) for stage, bf16 in RUNS]
    return dict(zip(RUNS, run_jobs(DP, jobs, workdir)))


@pytest.mark.timeout(600)
@pytest.mark.parametrize("stage, bf16", RUNS)
def test_each_point_of_a_step_holds_the_bytes_computed_from_the_shapes(sampled, stage, bf16):
    want = expected_samples(stage, bf16, model_parameters())
    for rank, record in enumerate(sampled[stage, bf16]):
        second = [s for s in record["samples"] if s["step"] == STEPS]
        assert [s["point"] for s in second] == list(want), f"rank {rank}"
        for sample in second:
            got = {key: sample[key] for key in want[sample["point"]]}
            assert got == want[sample["point"]], f"rank {rank} {sample['point']}"
        peak = max(want.values(), key=lambda counts: sum(counts.values()))
        assert record["peak"]["step"] == STEPS and {k: record["peak"][k] for k in peak} == peak, f"rank {rank}"


def test_the_stage_2_peak_is_the_by_hand_figure(sampled):
    sizes = model_parameters()
    assert (sum(sizes.values()), len(sizes)) == (7920, 20)
    for record in sampled[2, False]:
        assert record["peak"]["point"] == FORWARD_END
        assert sum(record["peak"][k] for k in ("parameters", "gradients", "optimizer", "autocast_copies")) == \
            STAGE2_FP32_PEAK_BY_HAND


def test_the_peak_needs_a_step_after_the_first():
    with pytest.raises(ValueError, match="two sampled training steps"):
        StepStateSampler(torch.device("cpu")).peak()


def test_a_plain_loop_is_sampled_at_the_four_points_and_evaluation_and_later_runs_are_not():
    model = nn.Linear(4, 4)  # 16 + 4 float32 parameters: 80 bytes
    optimizer = torch.optim.AdamW(model.parameters())
    with StepStateSampler(torch.device("cpu")) as sampler:
        for _ in range(STEPS):
            optimizer.zero_grad(set_to_none=True)
            model(torch.randn(2, 4)).sum().backward()
            optimizer.step()
            with torch.no_grad():
                model(torch.randn(2, 4))
    model(torch.randn(2, 4)).sum().backward()  # after the sampler: no hooks left
    assert [(s.step, s.point) for s in sampler.samples] == [(step, point) for step in (1, 2) for point in STEP_POINTS]
    # Two moments of 80 bytes and a float32 step per tensor; the first of the equal largest samples.
    assert sampler.peak() == StateSample(step=2, point=BACKWARD_END, parameters=80, gradients=80,
                                         optimizer=2 * 80 + 2 * STEP_BYTES, autocast_copies=0)


def test_autocast_copies_count_each_cast_weight_once_with_the_cache_and_each_use_without():
    """A weight used twice is cast once (autocast's cache), twice without the cache; a layer norm's weight stays
    float32 on a CPU."""
    linear, norm = nn.Linear(8, 8), nn.LayerNorm(8)
    x = torch.randn(2, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = norm(linear(linear(x)))
    assert sorted(autocast_copy_bytes([out], torch.bfloat16).values()) == [8 * BF16_BYTES, 64 * BF16_BYTES]
    with torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=False):
        out = linear(linear(x))
    assert sorted(autocast_copy_bytes([out], torch.bfloat16).values()) == [8 * BF16_BYTES] * 2 + [64 * BF16_BYTES] * 2


def test_a_forward_under_autocast_holds_its_weight_casts_until_the_backward_has_used_them():
    model = nn.Linear(4, 4)  # 16 + 4 weights, cast to bf16 in the forward
    autocast_forward(model, "cpu", torch.bfloat16)
    optimizer = torch.optim.AdamW(model.parameters())
    with StepStateSampler(torch.device("cpu"), torch.bfloat16) as sampler:
        for _ in range(STEPS):
            optimizer.zero_grad(set_to_none=True)
            model(torch.randn(2, 4)).float().sum().backward()
            optimizer.step()
    copies = {sample.point: sample.autocast_copies for sample in sampler.samples if sample.step == STEPS}
    assert copies == {FORWARD_END: (16 + 4) * BF16_BYTES, BACKWARD_END: 0, BEFORE_STEP: 0, AFTER_STEP: 0}
