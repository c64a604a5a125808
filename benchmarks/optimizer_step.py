"""AdamW's step on a CPU: the kernel `train` picks (`trainer.optim.optimizer.select_adamw_kernel`) against the others.

For each GPT shape, the model's parameters (fp32, as the trainer keeps them) get seeded random gradients, and
the trainer's optimiser (`build_optimizer`: Megatron's parameter groups) steps them with each AdamW kernel of
`ADAMW_KERNEL_OPTIONS` in turn; rounds alternate between the kernels, each round's figure is the median of its
timed steps (warm-up steps dropped), and the report is the median round. Shapes: the tests' tiny GPT, and
GPT-2 small (124M parameters), the quickstart's model class at the size a CPU user trains.

    python -m benchmarks.optimizer_step                      # ms per step of each kernel, ratios to the picked one
    python -m benchmarks.optimizer_step --shape small --rounds 5 --steps 10

Target: the picked kernel is the fastest.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from trainer.config import OptimizerConfig
from trainer.models.gpt.model import GPT, GPTShape
from trainer.optim.optimizer import ADAMW_KERNEL_OPTIONS, build_optimizer, select_adamw_kernel

SEED = 1234
WARMUP_STEPS = 2
MS_PER_S = 1000.0
SHAPES = {
    "tiny": GPTShape(num_layers=2, hidden_size=64, num_attention_heads=4, ffn_hidden_size=256,
                     max_position_embeddings=128, padded_vocab_size=512),
    "small": GPTShape(num_layers=12, hidden_size=768, num_attention_heads=12, ffn_hidden_size=3072,
                      max_position_embeddings=1024, padded_vocab_size=50304),
}


def step_ms(model: GPT, kernel: str, steps: int) -> float:
    """Median milliseconds of ``steps`` AdamW steps of ``model``'s parameters with ``kernel`` (after warm-up)."""
    optimizer = build_optimizer(list(model.named_parameters()), OptimizerConfig(lr=1e-4, weight_decay=0.01),
                                **ADAMW_KERNEL_OPTIONS[kernel])
    times = []
    for _ in range(WARMUP_STEPS + steps):
        begin = time.perf_counter()
        optimizer.step()
        times.append(time.perf_counter() - begin)
    return statistics.median(times[WARMUP_STEPS:]) * MS_PER_S


def benchmark(name: str, rounds: int, steps: int) -> None:
    torch.manual_seed(SEED)
    model = GPT(SHAPES[name])
    for param in model.parameters():
        param.grad = torch.randn_like(param)
    picked = select_adamw_kernel("cpu", list(model.parameters()))
    figures: dict[str, list[float]] = {kernel: [] for kernel in ADAMW_KERNEL_OPTIONS}
    for _ in range(rounds):
        for kernel in ADAMW_KERNEL_OPTIONS:
            figures[kernel].append(step_ms(model, kernel, steps))
    count = sum(param.numel() for param in model.parameters())
    print(f"{name}: {count / 1e6:.1f}M parameters, {len(list(model.parameters()))} tensors; "
          f"median of {rounds} rounds of {steps} steps; torch {torch.__version__}, {torch.get_num_threads()} threads")
    best = statistics.median(figures[picked])
    for kernel, times in figures.items():
        median = statistics.median(times)
        mark = "  (train's pick)" if kernel == picked else ""
        print(f"  {kernel:9s} {median:9.2f} ms/step  x{median / best:5.2f} the pick's time{mark}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", choices=(*SHAPES, "all"), default="all")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=5, help="timed steps per round and kernel")
    args = parser.parse_args()
    for name in SHAPES if args.shape == "all" else (args.shape,):
        benchmark(name, args.rounds, args.steps)


if __name__ == "__main__":
    main()
