"""The MoE layer's forward+backward against a dense MLP with the same active parameters, and the grouped
expert GEMM against a per-expert Python loop.

Top-1 routing over E experts of width ``ffn`` runs, per token, the same two matmuls as a dense MLP of width
``ffn``: the dense layer is the floor (the MoE adds the router, the sort and the gather/scatter of tokens).
The router is initialised small, so tokens spread over the experts about evenly, as a trained, balanced
router's do. Runs alternate between the variants (all see the same load); each figure is the median of
``--repeats`` timed runs after one warm-up.

    python -m benchmarks.moe                                    # CPU, fp32
    python -m benchmarks.moe --device cuda --dtype bfloat16     # GPU: torch._grouped_mm, tokens/s
    python -m benchmarks.moe --ep 2                             # + all-to-all share at EP 2 (gloo, CPU)

The grouped path is the one the layer picks (`trainer.moe.experts.select_backend`: ``grouped_mm`` on the
CPU with torch 2.9+ and aligned sizes, else ``segmented``); the other per-expert paths are timed beside it.
Targets (the issue): MoE <= 1.5 x dense; the grouped path faster than the naive per-expert loop.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn

from trainer.moe.experts import BATCHED, LOOP, SEGMENTED, select_backend
from trainer.moe.layer import MoELayer
from trainer.moe.settings import MoESettings

# A small router: near-uniform routing, as a balanced trained router gives.
ROUTER_INIT_STD = 1e-3
WEIGHT_INIT_STD = 0.02
COLLECTIVE_OPS = ("_c10d_functional::all_to_all_single", "_c10d_functional::wait_tensor")


class DenseMLP(nn.Module):
    """The dense baseline: one expert's shape, applied to every token (no biases, tanh GELU)."""

    def __init__(self, hidden: int, ffn: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(hidden, ffn, bias=False)
        self.w2 = nn.Linear(ffn, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.gelu(self.w1(x), approximate="tanh"))


def time_forward_backward(module: nn.Module, x: torch.Tensor, repeats: int) -> float:
    """Median seconds of forward + backward of ``module`` on ``x`` (after one warm-up run)."""
    times = []
    for index in range(repeats + 1):
        inputs = x.detach().requires_grad_(True)
        if x.device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        module(inputs).float().square().mean().backward()
        if x.device.type == "cuda":
            torch.cuda.synchronize()
        if index:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def build_moe(hidden: int, ffn: int, experts: int, backend: str | None, device: torch.device,
              dtype: torch.dtype) -> MoELayer:
    """A top-1 MoE layer on ``backend`` (None: the layer's own choice), near-uniform routing."""
    layer = MoELayer(hidden, ffn, "gelu", MoESettings(num_experts=experts, top_k=1, aux_loss_coeff=0.01))
    layer.experts.backend = backend
    with torch.no_grad():
        layer.router.weight.normal_(0.0, ROUTER_INIT_STD)
        for weight in (layer.experts.w1.weight, layer.experts.w2.weight):
            weight.normal_(0.0, WEIGHT_INIT_STD)
    return layer.to(device, dtype)


def _ep_worker(rank: int, port: int, args: argparse.Namespace, out: str) -> None:
    """One of ``args.ep`` gloo processes: MoE fwd+bwd with the experts sharded over the ep ranks; the share
    of the time spent in the all-to-all exchanges (forward and backward), from the profiler."""
    import os

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from trainer.moe.parallel import apply_ep

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=args.ep)
    torch.manual_seed(0)  # the same weights on every rank: each keeps its experts
    layer = build_moe(args.hidden, args.ffn, args.experts, None, torch.device("cpu"), torch.float32)
    apply_ep(layer, init_device_mesh("cpu", (args.ep,), mesh_dim_names=("ep",)))
    torch.manual_seed(1 + rank)  # each rank its own tokens
    x = torch.randn(args.tokens // args.ep, args.hidden)
    time_forward_backward(layer, x, repeats=1)  # warm-up
    with torch.profiler.profile() as profile:
        total = sum(time_forward_backward(layer, x, repeats=1) for _ in range(args.repeats))
    # The functional collectives' own ops (issue and wait), forward and backward, counts exchange included.
    comm_us = sum(event.cpu_time_total for event in profile.events() if event.name in COLLECTIVE_OPS)
    if rank == 0:
        with open(out, "w", encoding="utf-8") as file:
            file.write(f"{total / args.repeats} {comm_us / 1e6 / args.repeats}")
    dist.destroy_process_group()


def ep_overhead(args: argparse.Namespace) -> tuple[float, float]:
    """(seconds per fwd+bwd, of which in all-to-all) on rank 0 of ``args.ep`` spawned gloo processes."""
    import socket
    import tempfile

    import torch.multiprocessing as mp

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with tempfile.TemporaryDirectory() as directory:
        out = f"{directory}/ep.txt"
        mp.start_processes(_ep_worker, args=(port, args, out), nprocs=args.ep, start_method="spawn")
        with open(out, encoding="utf-8") as file:
            seconds, comm = map(float, file.read().split())
    return seconds, comm


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--ffn", type=int, default=2048)
    parser.add_argument("--experts", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--threads", type=int, default=0,
                        help="torch's intra-op threads (0: torch's default); 1 keeps a shared machine's load from "
                             "stalling the many small parallel regions of the per-expert products")
    parser.add_argument("--ep", type=int, default=0,
                        help="also time expert parallelism over this many gloo CPU processes (0: skip)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    torch.manual_seed(0)
    x = torch.randn(args.tokens, args.hidden, device=device, dtype=dtype)
    # The path the layer picks for these operands (what training runs), and the alternatives.
    grouped = select_backend(x, torch.empty(args.experts, args.hidden, args.ffn, device=device, dtype=dtype))
    others = [backend for backend in (SEGMENTED, BATCHED) if backend != grouped]
    variants = {"dense": DenseMLP(args.hidden, args.ffn).to(device, dtype),
                f"moe_{grouped}": build_moe(args.hidden, args.ffn, args.experts, grouped, device, dtype),
                **{f"moe_{backend}": build_moe(args.hidden, args.ffn, args.experts, backend, device, dtype)
                   for backend in others},
                "moe_loop": build_moe(args.hidden, args.ffn, args.experts, LOOP, device, dtype)}
    seconds = {name: [] for name in variants}
    for _ in range(args.repeats):  # alternate: every variant sees the same machine load
        for name, module in variants.items():
            seconds[name].append(time_forward_backward(module, x, repeats=1))
    median = {name: statistics.median(values) for name, values in seconds.items()}
    print(f"tokens {args.tokens}, hidden {args.hidden}, ffn {args.ffn}, experts {args.experts} (top-1), "
          f"{args.device} {args.dtype}, torch {torch.__version__}, {torch.get_num_threads()} threads")
    for name, value in median.items():
        print(f"  {name:16s} fwd+bwd {1000 * value:9.2f} ms   {args.tokens / value:12.0f} tokens/s")
    print(f"  moe_{grouped} / dense:   {median[f'moe_{grouped}'] / median['dense']:.2f}x  (target <= 1.5)")
    print(f"  moe_loop / moe_{grouped}: {median['moe_loop'] / median[f'moe_{grouped}']:.2f}x  (target > 1)")
    for backend in others:
        print(f"  moe_{backend} / moe_{grouped}: {median[f'moe_{backend}'] / median[f'moe_{grouped}']:.2f}x")
    if args.ep > 1:
        seconds, comm = ep_overhead(args)
        print(f"  EP {args.ep} (gloo, 1 thread per process, {args.tokens // args.ep} tokens per rank): fwd+bwd "
              f"{1000 * seconds:.2f} ms, all-to-all {1000 * comm:.2f} ms = {100 * comm / seconds:.1f}% of it")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
