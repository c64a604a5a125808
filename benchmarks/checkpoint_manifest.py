"""What the checkpoint manifest costs: save and load with and without its SHA-256 checksums, same run.

A GPT-2-small-sized state (124 M parameters as fp32 weights plus AdamW's two moments: ~1.5 GB) is saved
with `trainer.checkpoint.save.save_checkpoint` (DCP, then the manifest) and loaded back with
`load_checkpoint` with and without verification. Rounds alternate; medians are printed with the ratios.

    python -m benchmarks.checkpoint_manifest             # ~1.5 GB state, 3 rounds
    python -m benchmarks.checkpoint_manifest --parameters 50e6 --rounds 5
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch

from indexed_dataset.cli_parser import finite_float
from trainer.checkpoint.load import load_checkpoint
from trainer.checkpoint.save import save_checkpoint
from trainer.checkpoint.store import checkpoint_dir
from trainer.checkpoint.manifest import write_manifest

GPT2_SMALL_PARAMETERS = 124e6
# Tensors of this many elements (a transformer's matrices are of this order).
TENSOR_ELEMENTS = 4 * 1024 * 1024
# What a training checkpoint holds per parameter: the weight and AdamW's exp_avg and exp_avg_sq.
TENSORS_PER_PARAMETER = ("model", "optim.exp_avg", "optim.exp_avg_sq")


def make_state(parameters: float) -> dict[str, torch.Tensor]:
    """Random fp32 tensors of ``parameters`` elements per kind in `TENSORS_PER_PARAMETER`."""
    generator = torch.Generator().manual_seed(0)
    count = max(1, int(parameters) // TENSOR_ELEMENTS)
    return {f"{kind}.{i}": torch.randn(TENSOR_ELEMENTS, generator=generator)
            for kind in TENSORS_PER_PARAMETER for i in range(count)}


def timed(function) -> float:
    start = time.perf_counter()
    function()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parameters", type=finite_float, default=GPT2_SMALL_PARAMETERS, help="parameters of the model")
    parser.add_argument("--rounds", type=int, default=3, help="rounds (medians are reported)")
    args = parser.parse_args()
    state = make_state(args.parameters)
    gigabytes = sum(t.numel() * t.element_size() for t in state.values()) / 1e9
    times: dict[str, list[float]] = {name: [] for name in ("save", "manifest", "load", "load_verified")}
    with tempfile.TemporaryDirectory() as scratch:
        for round_index in range(args.rounds):
            root = Path(scratch) / f"round{round_index}"
            # save_checkpoint writes the manifest itself; time it apart by rewriting it.
            times["save"].append(timed(lambda: save_checkpoint(root, 1, state)))
            times["manifest"].append(timed(lambda: write_manifest(checkpoint_dir(root, 1))))
            target = {name: torch.empty_like(t) for name, t in state.items()}
            # Alternate which load goes first: the first one also warms the page cache for the second.
            for verify in (False, True) if round_index % 2 == 0 else (True, False):
                key = "load_verified" if verify else "load"
                times[key].append(timed(lambda: load_checkpoint(root, 1, target, verify=verify)))
            assert all(torch.equal(target[n], state[n]) for n in state)
            shutil.rmtree(root)
    medians = {name: statistics.median(values) for name, values in times.items()}
    save_without = medians["save"] - medians["manifest"]
    print(json.dumps({"state_gb": round(gigabytes, 2), "rounds": args.rounds,
                      "median_s": {k: round(v, 3) for k, v in medians.items()},
                      "save_cost_of_manifest": round(medians["save"] / save_without, 3),
                      "load_cost_of_verification": round(medians["load_verified"] / medians["load"], 3),
                      "hash_gb_per_s": round(gigabytes / medians["manifest"], 2)}))


if __name__ == "__main__":
    main()
