"""Every parallel layout follows the single-process loss curve of the same model on the same data.

fp32, no dropout, 10 steps of the tiny model: tensor, pipeline (1F1B, GPipe, interleaved) and data
parallelism (DDP, FSDP2) and their 2-D combinations must give the reference's per-step losses and
gradient norms, and the final valid/test losses, within 1e-4.
"""

import pytest
from trainer_testing import run_in_processes, tiny_config

TOLERANCE = 1e-4

TWO_PROCESS_LAYOUTS = {
    "tp2": {"tp": 2},
    "tp2_sequence_parallel": {"tp": 2, "sequence_parallel": True},
    "pp2_1f1b": {"pp": 2},
    "pp2_gpipe": {"pp": 2, "schedule": "gpipe"},
    "pp2_interleaved": {"pp": 2, "schedule": "interleaved", "virtual_layers": 1},
    "dp2_ddp": {},
    "dp2_fsdp": {"distributed_optimizer": True},
}
FOUR_PROCESS_LAYOUTS = {
    "dp2_tp2": {"tp": 2},
    "pp2_tp2_sequence_parallel": {"pp": 2, "tp": 2, "sequence_parallel": True},
    "dp2_pp2": {"pp": 2},
}


def assert_follows(result: dict, reference: dict) -> None:
    assert len(result["losses"]) == len(reference["losses"])
    for step, (got, want) in enumerate(zip(result["losses"], reference["losses"]), start=1):
        assert got == pytest.approx(want, abs=TOLERANCE), f"loss of step {step}"
    for step, (got, want) in enumerate(zip(result["grad_norms"], reference["grad_norms"]), start=1):
        assert got == pytest.approx(want, abs=TOLERANCE), f"grad norm of step {step}"
    assert result["consumed_samples"] == reference["consumed_samples"]
    assert result["eval_losses"].keys() == {"valid", "test"}
    for split, loss in result["eval_losses"].items():
        assert loss == pytest.approx(reference["eval_losses"][split], abs=TOLERANCE), f"{split} loss"


@pytest.fixture(scope="module")
def two_process_results(tiny_prefix, cache_dir, workdir) -> dict:
    configs = [tiny_config(tiny_prefix, cache_dir, eval_iters=1, **layout) for layout in TWO_PROCESS_LAYOUTS.values()]
    return dict(zip(TWO_PROCESS_LAYOUTS, run_in_processes(2, configs, workdir)))


@pytest.fixture(scope="module")
def four_process_results(tiny_prefix, cache_dir, workdir) -> dict:
    configs = [tiny_config(tiny_prefix, cache_dir, eval_iters=1, **layout) for layout in FOUR_PROCESS_LAYOUTS.values()]
    return dict(zip(FOUR_PROCESS_LAYOUTS, run_in_processes(4, configs, workdir)))


def test_reference_run_learns(reference):
    assert len(reference["losses"]) == 10
    assert reference["losses"][-1] < reference["losses"][0] - 0.1


@pytest.mark.timeout(600)
@pytest.mark.parametrize("layout", list(TWO_PROCESS_LAYOUTS))
def test_two_process_layout_follows_single_process(layout, two_process_results, reference):
    assert_follows(two_process_results[layout], reference)


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("layout", list(FOUR_PROCESS_LAYOUTS))
def test_four_process_layout_follows_single_process(layout, four_process_results, reference):
    assert_follows(four_process_results[layout], reference)
