"""Expert parallelism: a dropless MoE GPT trained with its experts sharded over ep ranks follows the
single-process loss curve (and the same auxiliary metrics), in spawned gloo CPU processes."""

import dataclasses

import pytest
from trainer_testing import run_in_processes, tiny_config

from trainer.config import MoEConfig
from trainer.errors import TrainConfigError
from trainer.models import model_spec
from trainer.parallel.dims import resolve_parallel_dims

# The bar for dropless expert parallelism: the loss curve within 1e-4 of one process's.
EP_LOSS_ATOL = 1e-4
CAPACITY_STEPS = 3
MOE = MoEConfig(num_experts=4, moe_router_topk=2, moe_aux_loss_coeff=0.01, moe_z_loss_coeff=0.001)


def moe_config(prefix, cache, ep: int = 1, **overrides):
    config = tiny_config(prefix, cache, num_layers=2, **overrides)
    return dataclasses.replace(config, moe=dataclasses.replace(MOE, expert_model_parallel_size=ep))


def capacity_config(prefix, cache, ep: int = 1):
    config = moe_config(prefix, cache, ep=ep, train_iters=CAPACITY_STEPS)
    return dataclasses.replace(config, moe=dataclasses.replace(config.moe, moe_expert_capacity_factor=1.0))


@pytest.fixture(scope="module")
def single_process_runs(tiny_prefix, cache_dir, workdir) -> list[dict]:
    """The dropless run and the capacity-factor run in one process."""
    return run_in_processes(1, [moe_config(tiny_prefix, cache_dir), capacity_config(tiny_prefix, cache_dir)], workdir)


@pytest.fixture(scope="module")
def single_process(single_process_runs) -> dict:
    return single_process_runs[0]


@pytest.mark.slow  # 4-rank runs
def test_ep2_with_dp2_and_dp4_follow_the_single_process_loss_curve_dropless_and_with_capacity(
        single_process, single_process_runs, tiny_prefix, cache_dir, workdir):
    ep2_dp2, ep2_capacity = run_in_processes(2, [moe_config(tiny_prefix, cache_dir, ep=2),
                                                 capacity_config(tiny_prefix, cache_dir, ep=2)], workdir)
    ep2_dp4 = run_in_processes(4, [moe_config(tiny_prefix, cache_dir, ep=2)], workdir)[0]
    for run in (ep2_dp2, ep2_dp4):
        assert len(run["losses"]) == len(single_process["losses"]) == 10
        assert run["losses"] == pytest.approx(single_process["losses"], abs=EP_LOSS_ATOL)
        assert run["grad_norms"] == pytest.approx(single_process["grad_norms"], rel=1e-3)
        for got, want in zip(run["auxiliary"], single_process["auxiliary"]):
            assert got == pytest.approx(want, abs=1e-5)
    assert single_process["auxiliary"][0]["moe_dropped_fraction"] == 0.0  # dropless
    # With a capacity factor the same assignments are dropped in every layout (same fraction, same losses).
    capacity = single_process_runs[1]
    assert all(step["moe_dropped_fraction"] > 0 for step in capacity["auxiliary"])
    assert ep2_capacity["losses"] == pytest.approx(capacity["losses"], abs=EP_LOSS_ATOL)
    assert [step["moe_dropped_fraction"] for step in ep2_capacity["auxiliary"]] == \
        [step["moe_dropped_fraction"] for step in capacity["auxiliary"]]


@pytest.mark.parametrize(("overrides", "world_size", "message"), [
    (dict(num_experts=6, expert_model_parallel_size=4), 4, "num_experts (6) is not divisible by expert_model_parallel_size (4)"),
    (dict(num_experts=4, expert_model_parallel_size=4), 2, "data-parallel size (2) is not divisible by expert_model_parallel_size (4)"),
])
def test_expert_layout_rules_are_checked_up_front_with_one_line(tiny_prefix, cache_dir, overrides, world_size, message):
    layout = {4: dict(tp=2)}.get(world_size, {})
    config = tiny_config(tiny_prefix, cache_dir, num_layers=2, **layout)
    config = dataclasses.replace(config, moe=MoEConfig(**overrides))
    with pytest.raises(TrainConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        resolve_parallel_dims(config, world_size, model_spec(config.model.model).layout_rules)


@pytest.mark.slow  # 4-rank runs
@pytest.mark.parametrize("resumed_ep", [1, pytest.param(4, marks=pytest.mark.campaign)])  # 4 ranks: 10 s more
def test_a_checkpoint_saved_at_ep2_resumes_at_another_ep_on_the_single_process_curve(
        resumed_ep, single_process, tiny_prefix, cache_dir, workdir, tmp_path):
    half = len(single_process["losses"]) // 2
    root = str(tmp_path / "ep2")
    run_in_processes(2, [moe_config(tiny_prefix, cache_dir, ep=2, train_iters=half, save=root)], workdir)
    resumed = run_in_processes(resumed_ep, [moe_config(tiny_prefix, cache_dir, ep=resumed_ep, load=root)],
                               workdir)[0]
    assert resumed["losses"] == pytest.approx(single_process["losses"][half:], abs=EP_LOSS_ATOL)


def test_pp2_and_fsdp_dp2_with_experts_follow_the_single_process_loss_curve(
        single_process, tiny_prefix, cache_dir, workdir):
    """The auxiliary losses reach the gradient on any pipeline stage (scaled as the schedule scales the loss);
    ``distributed_optimizer=True`` is ZeRO stage 1 (Megatron's flag; the run is still named fsdp here):
    `ShardedAdamW` slices the stacked expert weights' AdamW state over DP 2 like any parameter's (at EP 1 they
    are plain tensors, not expert-sharded)."""
    pp2, fsdp = run_in_processes(2, [moe_config(tiny_prefix, cache_dir, pp=2),
                                     moe_config(tiny_prefix, cache_dir, distributed_optimizer=True)], workdir)
    for run in (pp2, fsdp):
        assert run["losses"] == pytest.approx(single_process["losses"], abs=EP_LOSS_ATOL)
        for got, want in zip(run["auxiliary"], single_process["auxiliary"]):
            assert got == pytest.approx(want, abs=1e-5)
