"""Evaluation passes say how far they are, and their pictures say what they show (issue 27, points 3 and 11).

Promised: a validation or test pass that runs longer than `trainer.train.EVAL_PROGRESS_INTERVAL_S` logs a
progress line on rank 0 ("valid evaluation at iteration N: k/K batches (s)"), so a long pass is never silent;
a short pass prints nothing extra. ``plot-metrics`` draws the loss-scale panel only when the scale moved or a
step was skipped, and its loss and perplexity panels say which marks are validation and which test.
"""

from __future__ import annotations

import pytest

import trainer.train
from trainer.cli.train import main as train

ARGV = ["--num-layers", "1", "--hidden-size", "32", "--num-attention-heads", "2", "--seq-length", "16",
        "--vocab-size", "256", "--make-vocab-size-divisible-by", "8", "--micro-batch-size", "2",
        "--global-batch-size", "2", "--device", "cpu", "--split", "80,10,10", "--train-iters", "1",
        "--eval-iters", "3", "--eval-interval", "1"]


@pytest.mark.parametrize("interval_s, lines_per_pass", [(0.0, 2), (3600.0, 0)])
def test_long_evaluation_passes_log_progress(tiny_prefix, cache_dir, monkeypatch, caplog, interval_s, lines_per_pass):
    monkeypatch.setattr(trainer.train, "EVAL_PROGRESS_INTERVAL_S", interval_s)
    caplog.set_level("INFO")
    assert train(["--dataset", tiny_prefix, "--data-cache-path", cache_dir, *ARGV]) == 0
    progress = [r.getMessage() for r in caplog.records if " evaluation at iteration " in r.getMessage()]
    # One valid pass (after the last step) and the test pass.
    assert len(progress) == 2 * lines_per_pass
    if lines_per_pass:
        assert progress[0].strip().startswith("valid evaluation at iteration 1: 1/3 batches")
        assert progress[-1].strip().startswith("test evaluation at iteration 1: 2/3 batches")


def _run(train: list[dict], evaluations: list[dict]):
    from pathlib import Path

    from trainer.metrics.records import MetricsRun

    return MetricsRun(name="run", path=Path("metrics.jsonl"), train=train, evaluations=evaluations)


@pytest.mark.parametrize("scales, skipped, drawn", [
    ([1.0, 1.0, 1.0], [0, 0, 0], False),        # fp32/bf16: a flat 1.0 says nothing
    ([65536.0, 32768.0, 32768.0], [0, 1, 1], True),  # fp16: the scale moved, a step was skipped
    ([1.0, 1.0, 1.0], [0, 0, 2], True),
])
def test_plot_metrics_draws_the_loss_scale_only_when_it_says_something(scales, skipped, drawn):
    """Point 11: plot-metrics leaves out a panel whose data says nothing, and labels test apart from validation."""
    from trainer.metrics.plot import panels_for

    train = [{"iteration": i + 1, "loss": 5.0 - i, "loss_scale": scale, "skipped_iterations": skip}
             for i, (scale, skip) in enumerate(zip(scales, skipped))]
    evaluations = [{"iteration": 3, "split": "valid", "loss": 4.0, "perplexity": 54.6},
                   {"iteration": 3, "split": "test", "loss": 4.1, "perplexity": 60.3}]
    panels = {panel.key: panel for panel in panels_for([_run(train, evaluations)])}
    assert ("loss_scale" in panels) == drawn
    assert "test" in panels["perplexity"].title and "validation" in panels["perplexity"].title.lower()
    assert "test" in panels["loss"].title
