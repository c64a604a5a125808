"""How long a save stalls the step loop: a synchronous save against ``--async-save``'s (`AsyncSaver`).

A GPT-2-small-sized state (124 M parameters as fp32 weights plus AdamW's two moments: ~1.5 GB, the state of
`benchmarks.checkpoint_manifest`) is saved once per round, and a stand-in for training steps (fp32 matrix
products) runs after it for twice as long as the synchronous save took (``--interval-over-save``). The stall
is the time the loop cannot step: the whole `save_checkpoint` call, against `AsyncSaver.start` (the copy to
CPU memory and the checks) plus whatever of the background write is still left when the loop asks for the
next save (`AsyncSaver.wait`). The steps that overlap a background write also run slower (the writer shares
the CPUs): that slowdown is printed apart. Medians over the rounds, with the ratio of the stalls. One saver
serves every round, as one serves every save of a run: the first round also allocates its CPU buffers.

    python -m benchmarks.checkpoint_save                 # ~1.5 GB state, 3 rounds
    python -m benchmarks.checkpoint_save --parameters 50e6 --rounds 5
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import tempfile
from pathlib import Path

import torch

from benchmarks.checkpoint_manifest import GPT2_SMALL_PARAMETERS, make_state, timed
from indexed_dataset.cli_parser import finite_float
from trainer.checkpoint.async_save import AsyncSaver
from trainer.checkpoint.save import save_checkpoint

# The stand-in step: a product of two square fp32 matrices of this size (tens of milliseconds on a CPU core),
# on one thread: a GPU run's step loop keeps one host thread busy and leaves the other cores to the writer.
STEP_MATRIX = 512
STEP_THREADS = 1
# The steps between two saves last this many times the round's synchronous save (a real run's save interval
# is far longer), so that the stall measures the copy, not a write still running at the next save.
INTERVAL_OVER_SAVE = 2.0
# Steps timed to learn the length of one.
CALIBRATION_STEPS = 20


def run_steps(steps: int) -> float:
    """Seconds that ``steps`` stand-in steps take."""
    a, b = torch.randn(STEP_MATRIX, STEP_MATRIX), torch.randn(STEP_MATRIX, STEP_MATRIX)
    threads = torch.get_num_threads()
    torch.set_num_threads(STEP_THREADS)
    try:
        return timed(lambda: [torch.mm(a, b) for _ in range(steps)])
    finally:
        torch.set_num_threads(threads)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parameters", type=finite_float, default=GPT2_SMALL_PARAMETERS, help="parameters of the model")
    parser.add_argument("--rounds", type=int, default=3, help="rounds (medians are reported)")
    parser.add_argument("--interval-over-save", type=finite_float, default=INTERVAL_OVER_SAVE,
                        help="seconds of steps after each save, as a multiple of the synchronous save's")
    args = parser.parse_args()
    state = make_state(args.parameters)
    gigabytes = sum(t.numel() * t.element_size() for t in state.values()) / 1e9
    times: dict[str, list[float]] = {name: [] for name in ("sync_stall", "async_stall", "async_start", "async_wait",
                                                           "steps_alone", "steps_beside_write")}
    # One saver for every round, as for every save of a run: its CPU buffers are allocated by the first save.
    saver = AsyncSaver(group=None)
    with tempfile.TemporaryDirectory() as scratch:
        for round_index in range(args.rounds):
            sync_root, async_root = Path(scratch) / f"sync{round_index}", Path(scratch) / f"async{round_index}"
            times["sync_stall"].append(timed(lambda: save_checkpoint(sync_root, 1, state)))
            step_s = run_steps(CALIBRATION_STEPS) / CALIBRATION_STEPS
            steps = math.ceil(args.interval_over_save * times["sync_stall"][-1] / step_s)
            times["steps_alone"].append(run_steps(steps))
            start = timed(lambda: saver.start(async_root, 1, state))
            times["steps_beside_write"].append(run_steps(steps))
            wait = timed(saver.wait)
            times["async_start"].append(start)
            times["async_wait"].append(wait)
            times["async_stall"].append(start + wait)
            shutil.rmtree(sync_root)
            shutil.rmtree(async_root)
    medians = {name: statistics.median(values) for name, values in times.items()}
    print(json.dumps({"state_gb": round(gigabytes, 2), "rounds": args.rounds,
                      "interval_over_save": args.interval_over_save,
                      "median_s": {k: round(v, 3) for k, v in medians.items()},
                      "async_stall_over_sync_stall": round(medians["async_stall"] / medians["sync_stall"], 3),
                      "step_slowdown_beside_write": round(medians["steps_beside_write"] / medians["steps_alone"], 3)}))


if __name__ == "__main__":
    main()
