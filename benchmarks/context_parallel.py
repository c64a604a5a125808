"""Context parallelism's throughput: tokens/s of a GPT's forward+backward at CP 1, 2, 4 for several sequence
lengths, and the share of the step spent in its collectives (the K/V all-gather and the gradients'
reduce-scatter, `trainer.parallel.context`, with the wait for the other ranks).

Each CP size runs in its own ``cp`` spawned processes (gloo on the CPU: the machine's cores are shared by the
ranks, so the figures show the layout's cost and its communication share, not a multi-GPU speed-up). One
sample per step; tokens/s counts the sequence's tokens once (the cp ranks together process one sequence).
Each figure is the median of ``--repeats`` timed steps after one warm-up.

``--data PREFIX`` (a token file of the real corpus, e.g. the benchmark corpus through `preprocess-data`) also
times how the cp ranks of a group come to hold the same samples: each rank reading them itself (the GPT
dataset's ``__getitem__``: index lookups and a memory-map slice; what `train` does) against rank 0 reading them
and broadcasting each sample's tensors over the cp group (Megatron's ``get_batch`` broadcast). Microseconds per
sample until every rank holds it, the median of ``--repeats`` passes over ``DATA_SAMPLES`` samples.

    python -m benchmarks.context_parallel                                  # seq 4k, 8k; CP 1, 2, 4
    python -m benchmarks.context_parallel --seq-lengths 4096 16384 32768 --cp 1 2 4 --hidden 64
    python -m benchmarks.context_parallel --cp 2 4 --data bench_data/corpus_en_text_document
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

from samplers import GPTDatasetConfig, build_gpt_datasets
from samplers.gpt.dataset import GPTDataset
from trainer.models.gpt.model import GPT, GPTShape
from trainer.parallel.context import GATHER_EVENT, REDUCE_SCATTER_EVENT, ContextLayout, apply_cp

VOCAB = 256
HEADS = 4
# The profiler's events of the K/V gathers (forward and backward) and of the gradients' reduce-scatter, each with
# the wait for the other ranks (gloo's collectives are asynchronous: the c10d ops themselves only enqueue the work).
COLLECTIVE_EVENTS = (GATHER_EVENT, REDUCE_SCATTER_EVENT)
# The samples each data pass reads (--data), and the tensors of a GPT sample (`samplers.gpt.dataset.GPTDataset`).
DATA_SAMPLES = 200
ITEM_DTYPES = {"tokens": torch.int64, "labels": torch.int64, "loss_mask": torch.float32, "position_ids": torch.int64}
LOCALHOST = "127.0.0.1"


def _read_all(dataset: GPTDataset, count: int) -> None:
    for index in range(count):
        dataset[index]


def _read_and_broadcast(dataset: GPTDataset, count: int, seq_len: int) -> None:
    for index in range(count):
        if dist.get_rank() == 0:
            item = dataset[index]
        else:
            item = {name: torch.empty(seq_len, dtype=dtype) for name, dtype in ITEM_DTYPES.items()}
        for name in ITEM_DTYPES:
            dist.broadcast(item[name], src=0)


def _data_figures(dataset: GPTDataset, seq_len: int, repeats: int) -> dict[str, float]:
    """Microseconds per sample until every cp rank holds it: each reading it, or rank 0 reading and broadcasting."""
    figures = {}
    for name, run in (("read_us", lambda: _read_all(dataset, DATA_SAMPLES)),
                      ("broadcast_us", lambda: _read_and_broadcast(dataset, DATA_SAMPLES, seq_len))):
        times = []
        for _ in range(repeats):
            dist.barrier()
            start = time.perf_counter()
            run()
            elapsed = torch.tensor(time.perf_counter() - start)
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # until the last rank holds the samples
            times.append(elapsed.item())
        figures[name] = statistics.median(times) / DATA_SAMPLES * 1e6
    return figures


def _dataset(prefix: str, seq_len: int, cache: str) -> GPTDataset:
    """The training split of ``prefix`` at ``seq_len`` (rank 0 builds its index arrays first, the others load
    them from the cache)."""
    config = GPTDatasetConfig(sequence_length=seq_len, blend=([prefix], None), split="100,0,0", path_to_cache=cache)
    for builder in (True, False):
        if (dist.get_rank() == 0) == builder:
            train, _, _ = build_gpt_datasets(config, sizes=(DATA_SAMPLES, 0, 0))
        dist.barrier()
    return train


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
            if args.data is not None:
                dataset = _dataset(args.data, seq_len, str(Path(out).parent / "index-cache"))
                results[seq_len].update(_data_figures(dataset, seq_len, args.repeats))
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
    parser.add_argument("--data", help="a token file prefix: also time reading each sample on every cp rank "
                                       "against reading it once and broadcasting it")
    args = parser.parse_args(argv)
    figures = run(args)
    data = f" {'read us':>9} {'bcast us':>9}" if args.data else ""
    print(f"{'seq':>7} {'cp':>3} {'tokens/s':>10} {'comm share':>10}{data}")
    for cp, per_seq in figures.items():
        for seq_len, figure in per_seq.items():
            data = f" {figure['read_us']:>9.1f} {figure['broadcast_us']:>9.1f}" if args.data else ""
            print(f"{seq_len:>7} {cp:>3} {figure['tokens_per_s']:>10.0f} {figure['communication_share']:>10.1%}{data}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
