"""Resuming and multi-process runs as a new user types them (issue 27, points 2 and 9).

Promised:
- ``train --dataset D --load RUN --train-iters N`` takes every model-shape setting from RUN's model_config.json,
  and the sequence length from its sequence_lengths.json: no shape flag has to be typed again;
- a flag the user does give that contradicts the checkpoint wins, and one warning line names the flag, its
  value and the checkpoint's;
- a checkpoint saved before the sequence length was recorded resumes at its position-table length;
- a multi-process run leaves nothing in the temporary directory (torch's launcher made a
  ``torchelastic_*`` folder per run and never removed it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainer.checkpoint.lengths import SEQUENCE_LENGTHS_FILE
from trainer.cli.train import main as train

SHAPE = ["--num-layers", "1", "--hidden-size", "32", "--num-attention-heads", "2", "--seq-length", "16",
         "--max-position-embeddings", "32", "--vocab-size", "256", "--make-vocab-size-divisible-by", "8"]
STEPS = ["--micro-batch-size", "2", "--global-batch-size", "2", "--eval-iters", "0", "--device", "cpu",
         "--split", "98,1,1"]
RUN_TIMEOUT_S = 300


def _base(tiny_prefix: str, cache_dir: str) -> list[str]:
    return ["--dataset", tiny_prefix, "--data-cache-path", cache_dir, *STEPS]


@pytest.fixture
def saved(tiny_prefix, cache_dir, tmp_path) -> Path:
    run = tmp_path / "run"
    assert train([*_base(tiny_prefix, cache_dir), *SHAPE, "--train-iters", "1", "--save", str(run)]) == 0
    return run


def test_resume_needs_no_shape_flag(saved, tiny_prefix, cache_dir, capsys):
    assert train([*_base(tiny_prefix, cache_dir), "--load", str(saved), "--save", str(saved),
                  "--train-iters", "2"]) == 0
    err = capsys.readouterr().err
    assert "error" not in err and "overrides" not in err
    assert (saved / "latest_checkpointed_iteration.txt").read_text().strip() == "2"
    assert json.loads((saved / SEQUENCE_LENGTHS_FILE).read_text()) == {"seq_length": 16}


def test_a_given_flag_contradicting_the_checkpoint_says_so_in_one_line(saved, tiny_prefix, cache_dir, caplog):
    assert train([*_base(tiny_prefix, cache_dir), "--load", str(saved), "--save", str(saved),
                  "--train-iters", "2", "--seq-length", "8"]) == 0
    lines = [record.getMessage() for record in caplog.records if "overrides" in record.getMessage()]
    assert lines == [f"warning: --seq-length 8 overrides the checkpoint's 16 ({saved})"]


def test_checkpoint_without_recorded_length_resumes_at_its_positions(saved, tiny_prefix, cache_dir):
    (saved / SEQUENCE_LENGTHS_FILE).unlink()  # as saved before the record existed
    assert train([*_base(tiny_prefix, cache_dir), "--load", str(saved), "--save", str(saved),
                  "--train-iters", "2"]) == 0
    assert json.loads((saved / SEQUENCE_LENGTHS_FILE).read_text()) == {"seq_length": 32}


def test_multi_process_run_leaves_nothing_in_the_temp_dir(tiny_prefix, cache_dir, tmp_path):
    temp = tmp_path / "tmp"
    temp.mkdir()
    env = {**os.environ, "TMPDIR": str(temp)}
    result = subprocess.run([sys.executable, "-m", "trainer.cli.train", *_base(tiny_prefix, cache_dir), *SHAPE,
                             "--train-iters", "1", "--nproc-per-node", "2", "--global-batch-size", "4"],
                            capture_output=True, text=True, env=env, timeout=RUN_TIMEOUT_S)
    assert result.returncode == 0, result.stderr[-2000:]
    assert sorted(path.name for path in temp.iterdir()) == []
