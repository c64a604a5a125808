"""Where the time of our training step goes: a `torch.profiler` trace summarised as text tables.

The step is `benchmarks.gpu_step`'s (our runner, bf16 autocast, the AdamW kernel the trainer picks, global
gradient norm and clipping; ``--compile``: as ``train --compile``) for ``--model`` (OneFlow's GPT-345M, or
LiBai's mT5-base) at its seeds' micro-batch (or ``--micro-batch-size``). After ``--warmup`` steps, ``--steps``
steps are timed untraced (the wall time of a step, against which the kernels' time says how busy the device is:
below 100% it waits on the host), then ``--steps`` steps are traced. The first table lists the 10 kernels that
took the most device time (on a CPU: the 10 operators with the most CPU time of their own) and the share of that
time in attention, matrix products, the optimiser and everything else; the second lists the same for the host's
side of the step (the operators' and the CUDA runtime's own CPU time, traced: the profiler's own cost included),
which names what the device waits on when it is not busy (on a CPU the first table is the host's).

    python -m benchmarks.device.profile_step --table profile.txt --json profile.json     # on the CUDA device
    python -m benchmarks.device.profile_step --compile --table profile.txt                # the compiled step
    python -m benchmarks.device.profile_step --model t5 --table profile_t5.txt            # mT5-base, eager
    python -m benchmarks.device.profile_step --device cpu --tiny --table profile.txt      # checks the script
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from benchmarks.gpu_step import EXIT_NO_CUDA, SEED, WORKLOADS, build_ours, write_json

TOP_KERNELS = 10
# Kernel (CUDA) and operator (CPU) name fragments of each category, lower case, tried in this order: the flash
# and memory-efficient attention kernels are CUTLASS kernels too, so attention is matched before the products.
CATEGORIES = {
    "attention": ("flash", "fmha", "attention", "sdpa"),
    "matmul": ("gemm", "nvjet", "xmma", "wgmma", "cutlass", "cublas", "matmul", "aten::mm", "aten::addmm",
               "aten::bmm", "aten::linear", "aten::_grouped_mm"),
    "optimizer": ("adam", "multi_tensor_apply", "_foreach_", "fused_adamw"),
}
OTHER = "other"
NAME_WIDTH = 90
US_PER_MS = 1000.0


def category(name: str) -> str:
    """The `CATEGORIES` key whose fragments ``name`` contains, else `OTHER`."""
    lowered = name.lower()
    return next((key for key, fragments in CATEGORIES.items() if any(f in lowered for f in fragments)), OTHER)


def kernel_times(trace: profile, device: torch.device) -> dict[str, float]:
    """Microseconds per kernel name over the trace (CPU: per operator, its own time without its children's).
    Regions named by ``record_function`` (the optimizer's ``Optimizer.step#AdamW.step``, ``ProfilerStep#N``) span
    kernels on the device's timeline too: they are left out, so no kernel's time counts twice."""
    times: dict[str, float] = {}
    for event in trace.key_averages():
        if device.type == "cuda":
            if event.device_type != DeviceType.CUDA or event.is_user_annotation:
                continue
            spent = event.self_device_time_total
        else:
            if event.device_type != DeviceType.CPU or event.key.startswith("ProfilerStep"):
                continue
            spent = event.self_cpu_time_total
        if spent > 0:
            times[event.key] = times.get(event.key, 0.0) + spent
    return times


def wall_ms_per_step(step: Callable[[int], torch.Tensor], device: torch.device, first: int, steps: int) -> float:
    """Milliseconds a step of ``step(index)`` takes, over ``steps`` untraced steps from index ``first``, timed from
    a drained device to a drained device."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    begin = time.perf_counter()
    for index in range(first, first + steps):
        step(index)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return (time.perf_counter() - begin) * US_PER_MS / steps


def summarise(times: dict[str, float], steps: int, unit: str, wall_ms: float) -> tuple[str, dict]:
    """The text table and its figures (per-step milliseconds, shares of the total; ``busy``: the kernels' time over
    the untraced step's wall time ``wall_ms``)."""
    total = sum(times.values())
    top = sorted(times.items(), key=lambda item: item[1], reverse=True)[:TOP_KERNELS]
    shares: dict[str, float] = {key: 0.0 for key in (*CATEGORIES, OTHER)}
    for name, spent in times.items():
        shares[category(name)] += spent / total
    lines = [f"top {TOP_KERNELS} {unit}s by time ({steps} steps traced; ms per step, share of all {unit} time)",
             f"{'ms/step':>9} {'share':>6}  {'category':<9}  name", "-" * (NAME_WIDTH + 30)]
    for name, spent in top:
        short = name if len(name) <= NAME_WIDTH else name[:NAME_WIDTH - 3] + "..."
        lines.append(f"{spent / US_PER_MS / steps:9.3f} {spent / total:6.1%}  {category(name):<9}  {short}")
    lines += ["", f"{'category':<10} {'ms/step':>9} {'share':>6}", "-" * 27]
    for key, share in shares.items():
        lines.append(f"{key:<10} {share * total / US_PER_MS / steps:9.3f} {share:6.1%}")
    lines.append(f"{'total':<10} {total / US_PER_MS / steps:9.3f} {1:6.1%}")
    busy = total / US_PER_MS / steps / wall_ms
    lines.append(f"{'wall':<10} {wall_ms:9.3f} {busy:6.1%} of it in {unit}s (untraced steps)")
    figures = {"unit": unit, "steps": steps, "total_ms_per_step": total / US_PER_MS / steps, "shares": shares,
               "wall_ms_per_step": wall_ms, "busy": busy,
               "top": [{"name": name, "ms_per_step": spent / US_PER_MS / steps, "share": spent / total,
                        "category": category(name)} for name, spent in top]}
    return "\n".join(lines) + "\n", figures


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", choices=tuple(WORKLOADS), default="gpt",
                        help="GPT-345M (gpt) or mT5-base (t5), as benchmarks/gpu_step.py builds them")
    parser.add_argument("--micro-batch-size", type=int, metavar="N", help="default: the model's seeds' own")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--tiny", action="store_true", help="the model's tiny shape (checks the script)")
    parser.add_argument("--compile", action="store_true", help="the step of train --compile")
    parser.add_argument("--warmup", type=int, default=3, help="untraced steps first")
    parser.add_argument("--steps", type=int, default=3, help="traced steps")
    parser.add_argument("--table", type=Path, required=True, help="write the text tables here")
    parser.add_argument("--json", type=Path, help="also write the figures to this JSON file")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.micro_batch_size is not None and args.micro_batch_size < 1:
        parser.error(f"--micro-batch-size must be at least 1, got {args.micro_batch_size}")
    if args.device == "cuda" and not torch.cuda.is_available():
        print("profile_step: no CUDA device is available (use --tiny --device cpu to check the script on a CPU)",
              file=sys.stderr)
        return EXIT_NO_CUDA
    device = torch.device(args.device)
    work = WORKLOADS[args.model](args.tiny)
    if args.micro_batch_size is not None:
        work = dataclasses.replace(work, micro_batch_size=args.micro_batch_size)
    batches = [work.batch(torch.Generator().manual_seed(SEED), device)]
    step, _ = build_ours(work, batches, device, compile_blocks=args.compile)
    for index in range(args.warmup):
        step(index)
    wall_ms = wall_ms_per_step(step, device, args.warmup, args.steps)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as trace:
        for index in range(args.steps):
            step(index)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    unit = "kernel" if device.type == "cuda" else "operator"
    table, figures = summarise(kernel_times(trace, device), args.steps, unit, wall_ms)
    if device.type == "cuda":
        host_table, host_figures = summarise(kernel_times(trace, torch.device("cpu")), args.steps, "host operator",
                                             wall_ms)
    else:  # the operators above are the host's
        host_table, host_figures = "the table above (a CPU runs the operators itself)\n", figures
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    header = (f"{work.title} training step on {name}: micro-batch {work.micro_batch_size} x "
              f"{' + '.join(map(str, work.lengths))} positions, bf16 autocast, "
              f"{'compile' if args.compile else 'eager'}\n\n")
    text = f"{header}{table}\nthe host's side of the step: {host_table}"
    args.table.write_text(text)
    print(text, end="")
    if args.json is not None:
        write_json(args.json, {"device": name, "model": args.model, "micro_batch_size": work.micro_batch_size,
                               **figures, "host": host_figures})
    return 0


if __name__ == "__main__":
    sys.exit(main())
