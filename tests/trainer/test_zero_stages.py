"""ZeRO stages (`trainer.parallel.zero`): every stage, and the optimiser offloaded to the CPU, follows stage 0's loss
curve within 1e-5 in fp32 over 10 steps (DP 2, DP 4, DP 2 x TP 2, DP 2 x PP 2 where allowed); a checkpoint
saved at one stage resumes at another and at another data-parallel size; the flag rules fail with one line.
"""

import dataclasses

import pytest
from trainer_testing import run_in_processes, tiny_config

from trainer.config import MoEConfig, ParallelismConfig, TrainConfig
from trainer.errors import TrainConfigError

# fp32: the stages sum the same gradients in another order (all-reduce, reduce-scatter, bucketed or not),
# so losses differ by float rounding only; a missed reduction or a stale shard moves them by percents.
LOSS_ATOL = 1e-5
HALF = 5


def zero_config(prefix, cache, stage: int, offload: bool = False, **overrides):
    config = tiny_config(prefix, cache, **overrides)
    return dataclasses.replace(config, parallelism=dataclasses.replace(config.parallelism, zero_stage=stage,
                                                                      cpu_offload=offload))


def assert_follows(run: dict, reference: dict, label: str) -> None:
    assert run["losses"] == pytest.approx(reference["losses"], abs=LOSS_ATOL), label
    assert run["grad_norms"] == pytest.approx(reference["grad_norms"], abs=LOSS_ATOL), label


@pytest.fixture(scope="module")
def dp2_runs(tiny_prefix, cache_dir, workdir) -> dict:
    layouts = {"stage0": (0, False), "stage1": (1, False), "stage2": (2, False), "stage3": (3, False),
               "stage1_offload": (1, True), "stage2_offload": (2, True), "stage3_offload": (3, True)}
    configs = [zero_config(tiny_prefix, cache_dir, stage, offload) for stage, offload in layouts.values()]
    return dict(zip(layouts, run_in_processes(2, configs, workdir)))


@pytest.mark.timeout(600)
def test_every_stage_and_offload_follows_stage_0_at_dp2(dp2_runs, reference):
    assert_follows(dp2_runs["stage0"], reference, "stage 0 against one process")
    for label, run in dp2_runs.items():
        assert_follows(run, dp2_runs["stage0"], label)


def _assert_every_stage_follows_stage_0(layouts: dict[str, TrainConfig], workdir) -> None:
    """Run ``layouts`` ("<layout> stage<s>[ ...]": config) on 4 processes; each follows its layout's stage 0."""
    runs = dict(zip(layouts, run_in_processes(4, list(layouts.values()), workdir)))
    for label, run in runs.items():
        assert_follows(run, runs[label.split(" stage")[0] + " stage0"], label)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_every_stage_follows_stage_0_at_dp2xtp2_and_dp2xpp2(tiny_prefix, cache_dir, workdir):
    layouts = {f"dp2 tp2 stage{s}": zero_config(tiny_prefix, cache_dir, s, tp=2) for s in range(4)}
    layouts |= {f"dp2 pp2 stage{s}": zero_config(tiny_prefix, cache_dir, s, pp=2) for s in range(2)}
    layouts["dp2 tp2 stage1 offload"] = zero_config(tiny_prefix, cache_dir, 1, True, tp=2)
    _assert_every_stage_follows_stage_0(layouts, workdir)


@pytest.mark.campaign  # dp2 above shards every stage over two ranks already; four ranks, 13 s more
@pytest.mark.timeout(600)
def test_every_stage_follows_stage_0_at_dp4(tiny_prefix, cache_dir, workdir):
    _assert_every_stage_follows_stage_0({f"dp4 stage{s}": zero_config(tiny_prefix, cache_dir, s) for s in range(4)},
                                        workdir)


@pytest.mark.timeout(600)
def test_a_checkpoint_of_one_stage_resumes_at_another_stage_and_dp_size(tiny_prefix, cache_dir, workdir, tmp_path,
                                                                       dp2_runs):
    saves = {stage: str(tmp_path / f"stage{stage}") for stage in (1, 3)}
    run_in_processes(2, [zero_config(tiny_prefix, cache_dir, stage, train_iters=HALF, save=root)
                         for stage, root in saves.items()], workdir)
    resumed = run_in_processes(2, [zero_config(tiny_prefix, cache_dir, 3, load=saves[1]),
                                   zero_config(tiny_prefix, cache_dir, 1, load=saves[3]),
                                   zero_config(tiny_prefix, cache_dir, 0, load=saves[1])], workdir)
    resumed += run_in_processes(1, [zero_config(tiny_prefix, cache_dir, 0, load=saves[3])], workdir)
    for run in resumed:
        assert run["losses"] == pytest.approx(dp2_runs["stage0"]["losses"][HALF:], abs=LOSS_ATOL)


def test_use_distributed_optimizer_is_stage_1_and_a_larger_stage_wins():
    assert ParallelismConfig(use_distributed_optimizer=True).zero_stage == 1
    assert ParallelismConfig(use_distributed_optimizer=True, zero_stage=3).zero_stage == 3


@pytest.mark.parametrize("settings, message", [
    (dict(zero_stage=2, pipeline_model_parallel_size=2),
     "zero_stage 2 does not combine with pipeline_model_parallel_size (2) > 1: use zero_stage 0 or 1"),
    (dict(zero_stage=3, pipeline_model_parallel_size=4),
     "zero_stage 3 does not combine with pipeline_model_parallel_size (4) > 1: use zero_stage 0 or 1"),
    (dict(cpu_offload=True), "cpu_offload needs zero_stage >= 1 (DeepSpeed's offload_optimizer is a ZeRO option)"),
    (dict(zero_stage=4), "`zero_stage` must be in [0, 3], got 4"),
])
def test_layouts_zero_does_not_combine_with_fail_with_one_line(settings, message):
    with pytest.raises(TrainConfigError) as error:
        ParallelismConfig(**settings)
    assert str(error.value) == message


@pytest.mark.timeout(600)
def test_experts_follow_stage_0_at_stage_1_over_ep2_and_at_stage_3_over_ep1(tiny_prefix, cache_dir, workdir):
    """Stage 1 steps expert weights whole (already split over ep); stage 3's FSDP2 shards them like any weight."""
    def moe(stage: int, ep: int):
        config = zero_config(tiny_prefix, cache_dir, stage, num_layers=2)
        return dataclasses.replace(config, moe=MoEConfig(num_experts=4, moe_aux_loss_coeff=0.01,
                                                         expert_model_parallel_size=ep))
    ep2_stage0, ep2_stage1, ep1_stage0, ep1_stage3 = run_in_processes(
        2, [moe(0, 2), moe(1, 2), moe(0, 1), moe(3, 1)], workdir)
    assert_follows(ep2_stage1, ep2_stage0, "ep 2 stage 1")
    assert_follows(ep1_stage3, ep1_stage0, "ep 1 stage 3")
