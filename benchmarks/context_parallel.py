"""Context parallelism's throughput: tokens/s of a GPT's forward+backward at CP 1, 2, 4 for several sequence
lengths, and the share of the step spent in its collectives (the K/V all-gather and the gradients'
reduce-scatter, `trainer.parallel.context`, with the wait for the other ranks).

Each CP size runs in its own ``cp`` spawned processes (gloo on the CPU: the machine's cores are shared by the
ranks, so the figures show the layout's cost and its communication share, not a multi-GPU speed-up). One
sample per step; tokens/s counts the sequence's tokens once (the cp ranks together process one sequence).
Each figure is the median of ``--repeats`` timed steps after one warm-up.

    python -m benchmarks.context_parallel                                  # seq 4k, 8k; CP 1, 2, 4
    python -m benchmarks.context_parallel --seq-lengths 4096 16384 32768 --cp 1 2 4 --hidden 64
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

from trainer.models.gpt.model import GPT, GPTShape
from trainer.parallel.context import GATHER_EVENT, REDUCE_SCATTER_EVENT, ContextLayout, apply_cp

VOCAB = 256
HEADS = 4
# The profiler's events of the K/V gathers (forward and backward) and of the gradients' reduce-scatter, each with
# the wait for the other ranks (gloo's collectives are asynchronous: the c10d ops themselves only enqueue the work).
COLLECTIVE_EVENTS = (GATHER_EVENT, REDUCE_SCATTER_EVENT)
LOCALHOST = "127.0.0.1"


def _step(model: GPT, tokens: torch.Tensor, positions: torch.Tensor, targets: torch.Tensor) -> None:
    logits = model(tokens, positions)
    F.cross_entropy(logits.flatten(0, 1), targets.flatten()).backward()


def _worker(rank: int, cp: int, port: int, args: argparse.Namespace, out: str) -> None:
    os.environ.update(MASTER_ADDR=LOCALHOST, MASTER_PORT=str(port))
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // cp))
    dist.init_process_group("gloo", rank=rank, world_size=cp)
    results = {}
    try:
        for seq_len in args.seq_lengths:
            torch.manual_seed(0)
            shape = GPTShape(num_layers=args.layers, hidden_size=args.hidden, num_attention_heads=HEADS,
                             ffn_hidden_size=4 * args.hidden, max_position_embeddings=seq_len,
                             padded_vocab_size=VOCAB)
            model = GPT(shape)
            if cp > 1:
                apply_cp(model, dist.group.WORLD)
            layout = ContextLayout(cp, rank)
            sample = torch.randint(0, VOCAB, (1, seq_len + 1))
            positions = layout.shard(torch.arange(seq_len)[None])
            tokens, targets = layout.shard(sample[:, :-1]), layout.shard(sample[:, 1:])
            _step(model, tokens, positions, targets)
            times, shares = [], []
            for _ in range(args.repeats):
                dist.barrier()
                with profile(activities=[ProfilerActivity.CPU]) as prof:
                    start = time.perf_counter()
                    _step(model, tokens, positions, targets)
                    elapsed = time.perf_counter() - start
                comm_us = sum(event.cpu_time_total for event in prof.key_averages() if event.key in COLLECTIVE_EVENTS)
                times.append(elapsed)
                shares.append(comm_us / 1e6 / elapsed)
            results[seq_len] = {"tokens_per_s": seq_len / statistics.median(times),
                                "communication_share": statistics.median(shares)}
    finally:
        dist.destroy_process_group()
    if rank == 0:
        Path(out).write_text(json.dumps(results))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((LOCALHOST, 0))
        return s.getsockname()[1]


def run(args: argparse.Namespace) -> dict[int, dict[str, dict[str, float]]]:
    """{cp: {seq_len: {tokens_per_s, communication_share}}} for every CP size of ``args``."""
    figures = {}
    with tempfile.TemporaryDirectory() as tmp:
        for cp in args.cp:
            out = str(Path(tmp) / f"cp{cp}.json")
            mp.start_processes(_worker, args=(cp, _free_port(), args, out), nprocs=cp, start_method="spawn")
            figures[cp] = json.loads(Path(out).read_text())
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq-lengths", type=int, nargs="+", default=[4096, 8192])
    parser.add_argument("--cp", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    figures = run(args)
    print(f"{'seq':>7} {'cp':>3} {'tokens/s':>10} {'comm share':>10}")
    for cp, per_seq in figures.items():
        for seq_len, figure in per_seq.items():
            print(f"{seq_len:>7} {cp:>3} {figure['tokens_per_s']:>10.0f} {figure['communication_share']:>10.1%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
