"""A script launched once by torchrun may run several commands: each `train` call creates a process group of its
own over the launcher's one store and destroys it at its end. The later groups meet under keys of their own (the
second group once read the first's addresses and progress records, and hung in its first collective, two runs in
three)."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from several_runs_script import STEPS
from trainer_testing import LOSS_RTOL

SCRIPT = Path(__file__).with_name("several_runs_script.py")
RUN_TIMEOUT_S = 240


@pytest.mark.timeout(RUN_TIMEOUT_S + 60)
def test_a_script_under_torchrun_trains_three_times_and_the_repeated_layout_repeats_its_losses(
        tiny_prefix, cache_dir, tmp_path):
    out = tmp_path / "losses.json"
    environment = {**os.environ, "PYTHONPATH": str(SCRIPT.parent), "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp_path)}
    # A session of its own: a hung run's launcher and workers are killed together (none is left behind).
    run = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                            str(SCRIPT), tiny_prefix, cache_dir, str(out)], cwd=tmp_path, env=environment,
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        _, err = run.communicate(timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(run.pid, signal.SIGKILL)
        run.communicate()
        raise
    assert run.returncode == 0, err[-3000:]
    tp2, dp2, tp2_again = json.loads(out.read_text())
    assert len(tp2) == STEPS and tp2_again == tp2
    assert dp2 == pytest.approx(tp2, rel=LOSS_RTOL)  # two layouts of one run (the parity tests' tolerance)

