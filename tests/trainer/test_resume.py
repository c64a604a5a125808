"""Exact resume: N steps, a checkpoint, N more steps == 2N steps straight.

Bit for bit in one process, within 1e-6 in parallel layouts, and across a changed layout
(saved under TP=2, PP=2 or FSDP2, resumed in one process) within the parity tolerance.
"""

import pytest
from trainer_testing import TINY_STEPS, result_record, run_in_processes, tiny_config

from trainer.checkpoint import LATEST_FILE

HALF = TINY_STEPS // 2
PARALLEL_RESUME_TOLERANCE = 1e-6
LAYOUT_CHANGE_TOLERANCE = 1e-4


def test_single_process_resume_is_bit_exact(reference, tiny_prefix, cache_dir, tmp_path):
    first = result_record(tiny_config(tiny_prefix, cache_dir, train_iters=HALF, save=str(tmp_path)))
    second = result_record(tiny_config(tiny_prefix, cache_dir, load=str(tmp_path)))
    assert first["losses"] == reference["losses"][:HALF]
    assert second["losses"] == reference["losses"][HALF:]
    assert second["grad_norms"] == reference["grad_norms"][HALF:]
    assert second["consumed_samples"] == reference["consumed_samples"]


def test_checkpoint_directory_is_complete(tiny_prefix, cache_dir, tmp_path):
    result_record(tiny_config(tiny_prefix, cache_dir, train_iters=4, save=str(tmp_path), save_interval=2))
    assert (tmp_path / LATEST_FILE).read_text().strip() == "4"
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == ["iter_0000002", "iter_0000004"]


@pytest.fixture(scope="module")
def parallel_runs(tiny_prefix, cache_dir, workdir) -> dict:
    """Straight, first-half-and-save and resumed runs of TP=2, PP=2 and FSDP2, in one 2-process launch."""
    layouts = {"tp2": {"tp": 2}, "pp2": {"pp": 2}, "fsdp2": {"distributed_optimizer": True}}
    runs = {}
    for name, layout in layouts.items():
        save = str(workdir / f"resume_{name}")
        runs[f"{name}_straight"] = tiny_config(tiny_prefix, cache_dir, **layout)
        runs[f"{name}_first_half"] = tiny_config(tiny_prefix, cache_dir, train_iters=HALF, save=save, **layout)
        runs[f"{name}_resumed"] = tiny_config(tiny_prefix, cache_dir, load=save, **layout)
    results = dict(zip(runs, run_in_processes(2, list(runs.values()), workdir)))
    for name in layouts:
        results[f"{name}_checkpoint"] = str(workdir / f"resume_{name}")
    return results


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("layout", ["tp2", "pp2", "fsdp2"])
def test_parallel_resume_matches_straight_run(layout, parallel_runs):
    straight = parallel_runs[f"{layout}_straight"]
    assert parallel_runs[f"{layout}_first_half"]["losses"] == pytest.approx(straight["losses"][:HALF],
                                                                           abs=PARALLEL_RESUME_TOLERANCE)
    resumed = parallel_runs[f"{layout}_resumed"]
    assert resumed["losses"] == pytest.approx(straight["losses"][HALF:], abs=PARALLEL_RESUME_TOLERANCE)
    assert resumed["grad_norms"] == pytest.approx(straight["grad_norms"][HALF:], abs=PARALLEL_RESUME_TOLERANCE)


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("layout", ["tp2", "pp2", "fsdp2"])
def test_resume_in_one_process_from_parallel_checkpoint(layout, parallel_runs, reference, tiny_prefix, cache_dir):
    resumed = result_record(tiny_config(tiny_prefix, cache_dir, load=parallel_runs[f"{layout}_checkpoint"]))
    assert resumed["losses"] == pytest.approx(reference["losses"][HALF:], abs=LAYOUT_CHANGE_TOLERANCE)
    assert resumed["consumed_samples"] == reference["consumed_samples"]
