"""Exact resume: N steps, a checkpoint, N more steps == 2N steps straight.

Bit for bit in one process, within 1e-6 in parallel layouts, and across a changed layout
(saved under TP=2, PP=2 or FSDP2, resumed in one process) within the parity tolerance.
"""

import dataclasses

import pytest
import torch
from trainer_testing import TINY_STEPS, TINY_VOCAB, result_record, run_in_processes, tiny_config

from trainer.checkpoint.load import load_checkpoint
from trainer.checkpoint.store import LATEST_FILE, latest_iteration

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


# Vocabulary 256 padded to a multiple of 96 x TP: 288 rows in one process, 384 under TP 2.
REPADDED_DIVISIBLE_BY = 96


def _repadded(config):
    return dataclasses.replace(config, model=dataclasses.replace(config.model,
                                                                 make_vocab_size_divisible_by=REPADDED_DIVISIBLE_BY))


def _embedding(root: str, rows: int) -> torch.Tensor:
    state = {"model.tok_embeddings.weight": torch.empty(rows, 32)}
    load_checkpoint(root, latest_iteration(root), state)
    return state["model.tok_embeddings.weight"]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_any_layout_resumes_any_layout_whatever_the_vocabulary_padding(tiny_prefix, cache_dir, tmp_path, workdir):
    """TP 2 pads the vocabulary to 384 rows, one process to 288: each resumes the other's checkpoint,
    every real token's row carried over exactly, the training going on from the saved step."""
    from_one, from_tp2 = str(tmp_path / "saved_tp1"), str(tmp_path / "saved_tp2")
    result_record(_repadded(tiny_config(tiny_prefix, cache_dir, train_iters=HALF, save=from_one)))
    runs = [_repadded(tiny_config(tiny_prefix, cache_dir, tp=2, train_iters=HALF, save=from_tp2)),
            _repadded(tiny_config(tiny_prefix, cache_dir, tp=2, load=from_one, train_iters=HALF + 1,
                                  save=str(tmp_path / "tp2_from_one")))]
    first_half, tp2_from_one = run_in_processes(2, runs, workdir)
    one_from_tp2 = result_record(_repadded(tiny_config(tiny_prefix, cache_dir, load=from_tp2, train_iters=HALF + 1,
                                                       save=str(tmp_path / "one_from_tp2"))))
    for resumed in (tp2_from_one, one_from_tp2):
        assert resumed["iteration"] == HALF + 1 and len(resumed["losses"]) == 1
        assert resumed["consumed_samples"] == first_half["consumed_samples"] + 8
    # The resumed runs' embeddings after one more step differ from the saved ones by one AdamW update only.
    for saved, rows_saved, resumed, rows_resumed in ((from_one, 288, tmp_path / "tp2_from_one", 384),
                                                     (from_tp2, 384, tmp_path / "one_from_tp2", 288)):
        before, after = _embedding(saved, rows_saved), _embedding(str(resumed), rows_resumed)
        step = (after[:TINY_VOCAB] - before[:TINY_VOCAB]).abs().max()
        # One AdamW step moves a weight by about the learning rate (at most the peak rate); a row that was
        # not carried over would differ by the initialisation's scale, 0.02.
        assert 0 < step <= 1.5 * tiny_config(tiny_prefix, cache_dir).optimizer.lr
