"""Leaving a run early with a checkpoint (Megatron's --exit-interval, --exit-duration-in-mins,
--exit-signal-handler): the step in flight finishes, the run saves and exits 0 with one line, every rank at
the same step; resuming from that checkpoint continues the uninterrupted run bit for bit.
"""

from __future__ import annotations

import dataclasses
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from long_runs_testing import EXIT_TIMEOUT_S, REPO, signalled_train
from trainer_testing import argv_for, tiny_config

from trainer.checkpoint.store import LATEST_FILE, checkpoint_dir
from trainer.cli.train import main
from trainer.train import train

EXIT_AT = 4
LONG_RUN_ITERS = 100_000
# Minutes so short that the first step always ends after them.
INSTANT_MINUTES = 1e-6


def _with_training(config, **changes):
    return dataclasses.replace(config, training=dataclasses.replace(config.training, **changes))


def test_exit_interval_saves_and_the_resumed_run_continues_bit_for_bit(reference, tiny_prefix, cache_dir, tmp_path):
    save = str(tmp_path / "run")
    config = tiny_config(tiny_prefix, cache_dir, save=save, eval_iters=1)
    first = train(_with_training(config, exit_interval=EXIT_AT))
    assert first.iteration == EXIT_AT and "exit_interval" in first.exit_reason
    assert (Path(save) / LATEST_FILE).read_text().strip() == str(EXIT_AT)
    assert first.eval_losses == {}  # no final evaluation on an early exit
    resumed = train(dataclasses.replace(config, checkpoint=dataclasses.replace(config.checkpoint, load=save)))
    assert first.losses + resumed.losses == reference["losses"]
    assert resumed.exit_reason is None


def test_exit_duration_stops_after_the_step_that_crossed_it(tiny_prefix, cache_dir, tmp_path):
    save = tmp_path / "run"
    result = train(_with_training(tiny_config(tiny_prefix, cache_dir, save=str(save)),
                                  exit_duration_in_mins=INSTANT_MINUTES))
    assert result.iteration == 1 and "exit_duration_in_mins" in result.exit_reason
    assert checkpoint_dir(save, 1).is_dir()


@pytest.mark.timeout(600)
def test_ranks_agree_on_the_exit_duration(tiny_prefix, cache_dir, tmp_path):
    """Two ranks whose clocks cross the limit at different steps stop at the same one (a MAX all-reduce)."""
    save = tmp_path / "run"
    config = tiny_config(tiny_prefix, cache_dir, save=str(save), train_iters=LONG_RUN_ITERS)
    argv = [*argv_for(config), "--nproc-per-node", "2", "--master-port", "0", "--exit-duration-in-mins", "0.05"]
    assert main(argv) == 0
    pointer = int((save / LATEST_FILE).read_text())
    assert 1 <= pointer < LONG_RUN_ITERS and checkpoint_dir(save, pointer).is_dir()


@pytest.mark.timeout(900)
@pytest.mark.parametrize(("processes", "signal_name"), [
    (1, "SIGTERM"), (2, "SIGTERM"), pytest.param(2, "SIGUSR1", marks=pytest.mark.campaign)])  # any signal: one path
def test_the_exit_signal_saves_and_exits_0_with_one_line(processes, signal_name, tiny_prefix, cache_dir, tmp_path):
    save = tmp_path / "run"
    config = tiny_config(tiny_prefix, cache_dir, train_iters=LONG_RUN_ITERS, save=str(save), num_layers=2)
    argv = [*argv_for(config), "--log-interval", "1", "--nproc-per-node", str(processes), "--master-port", "0",
            "--exit-signal-handler", "--exit-signal", signal_name]
    code, lines = signalled_train(argv, signal.Signals[signal_name])
    assert code == 0, lines[-20:]
    assert not any("Traceback" in line or "error:" in line for line in lines), lines[-20:]
    exits = [line for line in lines if line.startswith("exiting at iteration")]
    assert len(exits) == 1 and f"{signal_name} received" in exits[0], lines[-20:]
    pointer = int((save / LATEST_FILE).read_text())
    assert exits[0].startswith(f"exiting at iteration {pointer} of {LONG_RUN_ITERS}")
    assert not list(save.glob("*.tmp"))


@pytest.mark.timeout(300)
def test_the_launcher_passes_the_exit_signal_to_every_worker(tmp_path):
    """The launcher of several processes, signalled itself, hands the signal on to each worker (which ends
    normally) instead of stopping them."""
    script = textwrap.dedent(f"""
        import signal, sys
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from long_runs_testing import wait_for_signal
        from trainer.config import LaunchConfig
        from trainer.parallel.distributed import launch
        results = launch(LaunchConfig(num_gpus_per_node=3, master_port=0), wait_for_signal, {str(tmp_path)!r},
                         "SIGUSR2", {EXIT_TIMEOUT_S / 2}, forward_signal=signal.SIGUSR2)
        print(sorted(results.items()))
    """)
    process = subprocess.Popen([sys.executable, "-c", script], cwd=REPO, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + EXIT_TIMEOUT_S
        while len(list(tmp_path.iterdir())) < 3 and time.monotonic() < deadline:
            time.sleep(0.2)
        process.send_signal(signal.SIGUSR2)
        out, err = process.communicate(timeout=EXIT_TIMEOUT_S)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0, err[-2000:]
    assert out.strip() == "[(0, 0), (1, 0), (2, 0)]"


@pytest.mark.parametrize(("flags", "named"), [
    (["--exit-signal", "SIGUSR1"], "--exit-signal-handler"),
    (["--exit-signal-handler", "--exit-signal", "SIGKILL"], "--exit-signal"),
    (["--exit-interval", "0"], "--exit-interval"),
    (["--exit-duration-in-mins", "0"], "--exit-duration-in-mins"),
    (["--keep-last-checkpoints", "2"], "--save"),
    (["--keep-last-checkpoints", "0", "--save", "ckpt"], "--keep-last-checkpoints"),
    (["--async-save"], "--save"),
    (["--max-restarts", "-1"], "--max-restarts"),
])
def test_a_bad_long_run_flag_is_one_line(flags, named, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    before = sorted(tmp_path.iterdir())
    try:
        code = main(["--dataset", "data/none", *flags])
    except SystemExit as exit_:  # argparse's own refusals (a choice, a type)
        code = exit_.code
    assert code != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("train: error:") and named in err[0], err
    assert "Traceback" not in err[0]
    assert sorted(tmp_path.iterdir()) == before
