"""examples/own_model.py runs as a user types it (issue 33, point 2): a model family of the user's own (their
module in a `ParallelPlan`, GPT's datasets over the bundled token file) trains with `trainer.train.train`, and its
loss falls, on GPT's datasets or on a dataset of the user's own over a token-file reader (``--own-dataset``);
nothing is written beside the data (the index cache goes where the user says)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "own_model.py"
STEPS = 8
RUN_TIMEOUT_S = 300
SUMMARY = re.compile(r"^tiny_mlp: loss ([0-9.]+) -> ([0-9.]+) over (\d+) steps$", re.MULTILINE)



@pytest.mark.parametrize("options", [[], ["--own-dataset"]], ids=["gpt-datasets", "own-dataset"])
def test_own_model_example_trains_on_the_token_files(options, golden, tmp_path):
    data = golden / "sample_en_eod_text_document"
    before = sorted(p.name for p in golden.iterdir())
    run = subprocess.run([sys.executable, str(EXAMPLE), str(data), "--steps", str(STEPS), "--data-cache-path",
                          str(tmp_path / "cache"), *options], cwd=tmp_path, capture_output=True, text=True,
                         timeout=RUN_TIMEOUT_S)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "Traceback" not in run.stderr
    first, last, steps = SUMMARY.search(run.stdout).groups()
    assert int(steps) == STEPS and float(last) < float(first)
    assert sorted(p.name for p in golden.iterdir()) == before
