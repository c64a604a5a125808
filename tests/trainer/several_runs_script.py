"""A user's script that runs `train` three times in one torchrun launch: tensor parallel 2, data parallel 2, tensor
parallel 2 again. Each run creates and destroys a process group of its own over the launcher's one store.

    python -m torch.distributed.run --standalone --nproc-per-node 2 several_runs_script.py PREFIX CACHE OUT

Rank 0 writes the three runs' losses to OUT as JSON.
"""

import json
import os
import sys
from pathlib import Path

import torch
from process_testing import TEST_THREADS
from trainer_testing import tiny_config

from trainer.train import train

STEPS = 3


def main(prefix: str, cache: str, out: str) -> None:
    torch.set_num_threads(TEST_THREADS)
    layouts = [{"tp": 2}, {}, {"tp": 2}]  # (no tp: the two processes are data parallel)
    losses = [train(tiny_config(prefix, cache, train_iters=STEPS, **layout)).losses for layout in layouts]
    if os.environ["RANK"] == "0":
        Path(out).write_text(json.dumps(losses))


if __name__ == "__main__":
    main(*sys.argv[1:])
