"""Training-step throughput on one GPU: our runner versus a plain PyTorch loop, same model, batch and precision.

Models (``--model``): OneFlow's GPT-345M (24 layers, hidden 1024, 16 heads, seq 1024, micro-batch 4)
and LiBai's mT5-base (12+12 layers, d_model 768, 12 heads of 64, gated-GELU d_ff 2048, vocabulary
250112, tied head; encoder 512, decoder 128 positions, micro-batch 16); bf16 autocast over fp32
weights on both sides; no dropout (the two sides draw no random numbers, so their losses match).

- ours: the trainer's `ParallelModel` of the family (its autocast, loss and, with ``--compile``, its
  torch.compile: of the whole model, a one-process run's), the AdamW kernel
  `trainer.optim.optimizer.select_adamw_kernel` picks (fused on CUDA), the trainer's global gradient norm
  and clipping;
- plain: the same model class with the same initial weights, ``torch.autocast``, cross-entropy,
  ``clip_grad_norm_`` and ``torch.optim.AdamW(fused=True)``; with ``--compile``, ``torch.compile`` of
  the whole model. Attention is ``scaled_dot_product_attention`` in both (the models call it).

Each side trains ``--warmup`` steps (compilation happens there), then ``--windows`` (3) windows of
``--steps`` timed steps on batches already on the device, each window timed between a drained device and
a drained device; it reports its median window's tokens/s, samples/s, model TFLOP/s (the trainer's FLOP
counts) and MFU against the device's bf16 peak (`trainer.metrics.writers.PEAK_FLOPS`), and its peak
memory. (On an H200, single 10-step windows at the seeds' small micro-batches, where the GPU waits on the
host, put mT5-base's ratio at 0.85 and 0.90 in two calls, and a 30-step window at 0.98.) The sides run one
after the other, each freed before the next is built, so each peak is its own.

    python -m benchmarks.gpu_step                          # both models, eager, on the CUDA device
    python -m benchmarks.gpu_step --compile                # the same, torch.compile
    python -m benchmarks.gpu_step --model gpt --steps 20 --windows 5
    python -m benchmarks.gpu_step --max-micro-batch 64 --json gpu_step.json   # also the largest micro-batch
                                                                              # that fits; figures as JSON
    python -m benchmarks.gpu_step --tiny --device cpu --steps 2    # end-to-end check of the script on a CPU

Without a CUDA device (and without ``--device cpu``) it prints one line and exits with status 2.
Target: ours/plain >= 0.95.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from trainer.config import OptimizerConfig, ParallelismConfig
from trainer.data.batches import IGNORE_INDEX
from trainer.models.gpt.data import GPTMicroBatch
from trainer.optim.grads import clip_factor, global_grad_norm, mean_loss, queue_host_read, scale_grads
from trainer.metrics.writers import device_peak_flops
from trainer.models import model_spec
from trainer.models.gpt.model import GPT, GPTShape
from trainer.models.gpt.training import flops_per_token as gpt_flops_per_token
from trainer.models.t5.data import T5MicroBatch
from trainer.models.t5.model import T5, T5Shape
from trainer.models.t5.training import flops_per_token as t5_flops_per_token
from trainer.optim.optimizer import ADAMW_KERNEL_OPTIONS, build_optimizer, select_adamw_kernel
from trainer.parallel.dims import ParallelDims, pad_vocab_size
from trainer.parallel.runner import ParallelModel

EXIT_NO_CUDA = 2
SEED = 1234
GIB = 2**30
CLIP_GRAD = 1.0
OPTIMIZER = OptimizerConfig(lr=1e-4, weight_decay=0.01)
# GPT-2's 50257 tokens padded to a multiple of 128, as Megatron (and OneFlow's 345M config) do.
GPT2_VOCAB = 50257
VOCAB_DIVISIBLE_BY = 128
MT5_VOCAB = 250112
# `--max-micro-batch`: a micro-batch fits when our eager step, run this many times (the optimiser's state is
# allocated by the first), peaks within this fraction of the device's memory: the plain and compiled runs at
# the same size need some room of their own (the allocator's fragmentation, compiled graphs' workspaces).
PROBE_STEPS = 2
FIT_FRACTION = 0.85
TINY_TITLE = " (tiny)"


@dataclass(frozen=True, slots=True)
class Workload:
    """One model of the benchmark: its family, shape, batch shape and costs."""

    family: str
    """`trainer.models` family name."""
    title: str
    """The model's name in reports: "GPT-345M", "mT5-base" ("(tiny)" added for the tiny shapes)."""
    shape: GPTShape | T5Shape
    build: Callable[[GPTShape | T5Shape], nn.Module]
    """The model class (the plain loop's model; ours builds the same class through its runner)."""
    micro_batch_size: int
    lengths: tuple[int, ...]
    """(seq,) for GPT, (encoder, decoder) for T5."""
    flops_per_token: float
    """Training FLOPs per position (the trainer's count)."""

    @property
    def tokens_per_sample(self) -> int:
        return sum(self.lengths)

    def batch(self, generator: torch.Generator, device: torch.device) -> GPTMicroBatch | T5MicroBatch:
        """A micro-batch of random ids (any id of the vocabulary; no padding)."""
        vocab = self.shape.padded_vocab_size if self.family == "gpt" else self.shape.vocab_size
        b = self.micro_batch_size

        def ids(length: int) -> torch.Tensor:
            return torch.randint(0, vocab, (b, length), generator=generator).to(device)

        if self.family == "gpt":
            (seq,) = self.lengths
            tokens = ids(seq + 1)
            positions = torch.arange(seq, device=device).expand(b, seq)
            return GPTMicroBatch(tokens[:, :-1], positions, tokens[:, 1:])
        encoder, decoder = self.lengths
        targets = ids(decoder)
        return T5MicroBatch(ids(encoder), ids(decoder), torch.ones(b, encoder, dtype=torch.int64, device=device),
                            targets)


def gpt_workload(tiny: bool) -> Workload:
    if tiny:
        shape = GPTShape(num_layers=2, hidden_size=32, num_attention_heads=2, ffn_hidden_size=128,
                         max_position_embeddings=32, padded_vocab_size=128)
        seq, micro_batch = 32, 2
    else:
        shape = GPTShape(num_layers=24, hidden_size=1024, num_attention_heads=16, ffn_hidden_size=4096,
                         max_position_embeddings=1024,
                         padded_vocab_size=pad_vocab_size(GPT2_VOCAB, VOCAB_DIVISIBLE_BY, tp=1))
        seq, micro_batch = 1024, 4
    return Workload(family="gpt", title="GPT-345M" + TINY_TITLE * tiny, shape=shape, build=GPT,
                    micro_batch_size=micro_batch, lengths=(seq,),
                    flops_per_token=gpt_flops_per_token(shape, seq))


def t5_workload(tiny: bool) -> Workload:
    if tiny:
        shape = T5Shape(vocab_size=128, d_model=32, d_kv=8, d_ff=64, num_heads=4, num_encoder_layers=1,
                        num_decoder_layers=1, feed_forward="gated-gelu")
        lengths, micro_batch = (32, 16), 2
    else:
        shape = T5Shape(vocab_size=MT5_VOCAB, d_model=768, d_kv=64, d_ff=2048, num_heads=12, num_encoder_layers=12,
                        num_decoder_layers=12, feed_forward="gated-gelu")
        lengths, micro_batch = (512, 128), 16
    return Workload(family="t5", title="mT5-base" + TINY_TITLE * tiny, shape=shape, build=T5,
                    micro_batch_size=micro_batch, lengths=lengths,
                    flops_per_token=t5_flops_per_token(shape, *lengths))


WORKLOADS = {"gpt": gpt_workload, "t5": t5_workload}


@dataclass(frozen=True, slots=True)
class Timing:
    """How each side is timed: ``warmup`` untimed steps (compilation happens there), then ``windows`` windows of
    ``steps`` steps; a side's rate is its median window's (one window's hiccup, a clock change, the host's other
    work, moves no figure)."""

    warmup: int
    steps: int
    windows: int


@dataclass(frozen=True, slots=True)
class SideResult:
    """What one side measured over its timed windows of steps."""

    seconds_per_step: list[float]
    """Each window's wall time per step, in the order run."""
    losses: list[float]
    """Every step's loss, warm-up steps first (read once, after the last window)."""
    peak_memory_bytes: int | None
    """None on a CPU."""

    @property
    def last_loss(self) -> float:
        return self.losses[-1]

    @property
    def median_seconds_per_step(self) -> float:
        return statistics.median(self.seconds_per_step)


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(device: torch.device, timing: Timing, step: Callable[[int], torch.Tensor]) -> SideResult:
    """Run ``step(index) -> loss`` as ``timing`` says, each window timed from a drained device to a drained one."""
    losses = [step(index).detach() for index in range(timing.warmup)]  # read at the end: no host read in a window
    _synchronize(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    seconds_per_step = []
    for window in range(timing.windows):
        first = timing.warmup + window * timing.steps
        begin = time.perf_counter()
        for index in range(first, first + timing.steps):
            losses.append(step(index).detach())
        _synchronize(device)
        seconds_per_step.append((time.perf_counter() - begin) / timing.steps)
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
    return SideResult(seconds_per_step=seconds_per_step, losses=torch.stack(losses).float().tolist(),
                      peak_memory_bytes=peak)


def build_ours(work: Workload, batches: list, device: torch.device,
               compile_blocks: bool) -> tuple[Callable[[int], torch.Tensor], dict[str, torch.Tensor]]:
    """Our side's ``step(index) -> loss`` and its initial weights (on the CPU) for the plain side to start from."""
    dims = ParallelDims(pp=1, dp=1, tp=1, micro_batch_size=work.micro_batch_size, num_microbatches=1)
    model = ParallelModel(model_spec(work.family).parallel_plan, work.shape, dims, None, ParallelismConfig(), device,
                          SEED, False, torch.bfloat16, compile_blocks=compile_blocks)
    initial = {name: p.detach().to("cpu", copy=True) for name, p in model.named_parameters()}
    params = [p for _, p in model.named_parameters()]
    kernel = select_adamw_kernel(device.type, params)
    optimizer = build_optimizer(model.named_parameters(), OPTIMIZER, **ADAMW_KERNEL_OPTIONS[kernel])
    model.set_train(True)
    unread: list[Callable[[], list[float]]] = []

    def step(index: int) -> torch.Tensor:
        # `trainer.train`'s step without fp16 loss scaling: the host reads a step's loss and gradient norm (the
        # trainer logs and checks them every step) while the next step's forward and backward are queued,
        # before its clipping and optimizer's step.
        optimizer.zero_grad(set_to_none=True)
        loss, _ = model.run([batches[index % len(batches)]], train=True)
        norm = global_grad_norm(model.norm_parameters(), None).total
        figures = queue_host_read(torch.stack([mean_loss(loss, True, 1, 1), norm]))
        if unread:
            unread.pop()()
        scale_grads(params, clip_factor(norm, CLIP_GRAD))
        optimizer.step()
        unread.append(figures)
        return loss

    return step, initial


def run_ours(work: Workload, batches: list, device: torch.device, timing: Timing,
             compile_blocks: bool) -> tuple[SideResult, dict[str, torch.Tensor]]:
    """Our side; also returns its initial weights (on the CPU) for the plain side to start from."""
    step, initial = build_ours(work, batches, device, compile_blocks)
    return _timed(device, timing, step), initial


def run_plain(work: Workload, batches: list, device: torch.device, timing: Timing, compile_model: bool,
              initial: dict[str, torch.Tensor]) -> SideResult:
    """The plain loop over the same model class, from the same initial weights."""
    with torch.device(device):
        model = work.build(work.shape)
    missing, unexpected = model.load_state_dict(initial, strict=False)
    # Ours names a tied head once (as the embedding); the plain model's copy shares the loaded tensor.
    plan = model_spec(work.family).parallel_plan
    tied = plan.tied_names(work.shape)
    if unexpected or set(missing) - ({tied[1]} if tied is not None else set()):
        raise RuntimeError(f"weights do not match the plain model: missing {missing}, unexpected {unexpected}")
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=OPTIMIZER.lr, weight_decay=OPTIMIZER.weight_decay,
                                  betas=(OPTIMIZER.adam_beta1, OPTIMIZER.adam_beta2), eps=OPTIMIZER.adam_eps,
                                  fused=True)
    forward = torch.compile(model) if compile_model else model

    def step(index: int) -> torch.Tensor:
        batch = batches[index % len(batches)]
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=torch.bfloat16):
            logits = forward(*plan.model_inputs(batch))
            loss = F.cross_entropy(logits.flatten(0, 1).float(), batch.targets.flatten(), ignore_index=IGNORE_INDEX)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP_GRAD)
        optimizer.step()
        return loss.detach()

    return _timed(device, timing, step)


def _free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def report(name: str, work: Workload, side: SideResult, peak_flops: float | None) -> dict:
    """Print one side's line (its median window's rates); returns its figures (``mfu`` a fraction, None where the
    peak is unknown; ``window_tokens_per_s`` each window's rate, in the order run)."""
    samples_per_s = work.micro_batch_size / side.median_seconds_per_step
    tokens_per_s = samples_per_s * work.tokens_per_sample
    tflops = tokens_per_s * work.flops_per_token / 1e12
    mfu = tflops * 1e12 / peak_flops if peak_flops else None
    peak_gib = side.peak_memory_bytes / GIB if side.peak_memory_bytes is not None else None
    mfu_text = f"{100 * mfu:5.1f}%" if mfu is not None else "  n/a"
    memory_text = f"{peak_gib:6.2f} GiB" if peak_gib is not None else "   n/a"
    print(f"  {name:5s}: {tokens_per_s:12,.0f} tokens/s  {samples_per_s:9.2f} samples/s  {tflops:8.2f} TFLOP/s  "
          f"MFU {mfu_text}  peak memory {memory_text}  last loss {side.last_loss:.4f}")
    return {"tokens_per_s": tokens_per_s, "samples_per_s": samples_per_s, "tflops": tflops, "mfu": mfu,
            "peak_memory_gib": peak_gib, "last_loss": side.last_loss, "losses": side.losses,
            "window_tokens_per_s": [work.micro_batch_size * work.tokens_per_sample / seconds
                                    for seconds in side.seconds_per_step]}


def fits(work: Workload, device: torch.device) -> bool:
    """Whether our eager step runs `PROBE_STEPS` steps of ``work`` within `FIT_FRACTION` of the device's memory
    (always on a CPU)."""
    step = batches = None
    try:
        batches = [work.batch(torch.Generator().manual_seed(SEED), device)]
        step, _ = build_ours(work, batches, device, compile_blocks=False)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        for index in range(PROBE_STEPS):
            step(index)
        _synchronize(device)
        fitted = device.type != "cuda" or (torch.cuda.max_memory_allocated(device)
                                           <= FIT_FRACTION * torch.cuda.get_device_properties(device).total_memory)
    except torch.OutOfMemoryError:
        fitted = False
    del step, batches  # before emptying the cache: the step's closure holds the model and optimiser
    _free(device)
    return fitted


def largest_micro_batch(work: Workload, device: torch.device, limit: int) -> int:
    """Doubling from ``work``'s micro-batch up to ``limit``: the largest at which our eager step `fits`."""
    best, candidate = work.micro_batch_size, 2 * work.micro_batch_size
    while candidate <= limit and fits(dataclasses.replace(work, micro_batch_size=candidate), device):
        best, candidate = candidate, 2 * candidate
    return best


def benchmark(family: str, args: argparse.Namespace, device: torch.device) -> list[dict]:
    """Both sides of one model at each micro-batch; prints their figures and returns one record per micro-batch
    (``ratio``: ours/plain tokens/s)."""
    seed_work = WORKLOADS[family](args.tiny)
    sizes = args.micro_batch_size or [seed_work.micro_batch_size]
    if args.max_micro_batch is not None:
        largest = largest_micro_batch(seed_work, device, args.max_micro_batch)
        print(f"{family}: the largest micro-batch that fits is {largest} (tried up to {args.max_micro_batch})")
        sizes = sorted({*sizes, largest})
    mode = "compile" if args.compile else "eager"
    timing = Timing(warmup=args.warmup, steps=args.steps, windows=args.windows)
    peak = device_peak_flops(device, low_precision=True)
    records = []
    for micro_batch_size in sizes:
        work = dataclasses.replace(seed_work, micro_batch_size=micro_batch_size)
        generator = torch.Generator().manual_seed(SEED)
        batches = [work.batch(generator, device) for _ in range(args.batches)]
        print(f"{work.title}: micro-batch {work.micro_batch_size} x "
              f"{' + '.join(map(str, work.lengths))} positions, bf16 autocast, {mode}, {timing.warmup} warm-up + "
              f"{timing.windows} x {timing.steps} timed steps (median window)")
        ours, initial = run_ours(work, batches, device, timing, args.compile)
        _free(device)
        plain = run_plain(work, batches, device, timing, args.compile, initial)
        del batches, initial
        _free(device)
        ours_figures = report("ours", work, ours, peak)
        plain_figures = report("plain", work, plain, peak)
        ratio = ours_figures["tokens_per_s"] / plain_figures["tokens_per_s"]
        gap = largest_loss_gap(ours.losses, plain.losses)
        print(f"  ratio ours/plain: {ratio:.3f} (target >= 0.95); losses apart by at most {gap['gap']:.4f} "
              f"(step {gap['step']}: {gap['ours']:.4f} ours, {gap['plain']:.4f} plain)")
        records.append({"model": family, "mode": mode, "micro_batch_size": micro_batch_size,
                        "tokens_per_sample": work.tokens_per_sample, "ours": ours_figures, "plain": plain_figures,
                        "ratio": ratio, "largest_loss_gap": gap})
    return records


def largest_loss_gap(ours: list[float], plain: list[float]) -> dict:
    """The step (0-based, warm-up included) where the two sides' losses differ most, and both losses there."""
    step = max(range(len(ours)), key=lambda index: abs(ours[index] - plain[index]))
    return {"step": step, "gap": abs(ours[step] - plain[step]), "ours": ours[step], "plain": plain[step]}


def write_json(path: Path, record: dict) -> None:
    """``record`` as JSON at ``path``, written under a temporary name first."""
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(record, indent=1) + "\n")
    os.replace(partial, path)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", choices=(*WORKLOADS, "all"), default="all")
    parser.add_argument("--compile", action="store_true",
                        help="torch.compile: ours as train --compile (here the whole model), plain the whole model")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per window")
    parser.add_argument("--windows", type=int, default=3,
                        help="timed windows per side; the figures are the median window's")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first (compilation happens here)")
    parser.add_argument("--batches", type=int, default=4, help="distinct random micro-batches, used in turn")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--tiny", action="store_true", help="tiny shapes of both models (checks the script)")
    parser.add_argument("--micro-batch-size", type=int, nargs="+", metavar="N",
                        help="micro-batches to measure (default: the model's own, as in the module docstring)")
    parser.add_argument("--max-micro-batch", type=int, metavar="LIMIT",
                        help="also measure the largest micro-batch (the model's own doubled, up to LIMIT) at which "
                             f"our eager step stays within {FIT_FRACTION * 100:.0f}%% of the device's memory")
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write every figure to this JSON file")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    for flag, values in (("--steps", [args.steps]), ("--windows", [args.windows]),
                         ("--micro-batch-size", args.micro_batch_size or []),
                         ("--max-micro-batch", [args.max_micro_batch] if args.max_micro_batch is not None else [])):
        if any(value < 1 for value in values):
            parser.error(f"{flag} must be at least 1, got {min(values)}")
    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_step: no CUDA device is available (use --tiny --device cpu to check the script on a CPU)",
              file=sys.stderr)
        return EXIT_NO_CUDA
    device = torch.device(args.device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"device: {name}; torch {torch.__version__}")
    records = [record for family in (WORKLOADS if args.model == "all" else (args.model,))
               for record in benchmark(family, args, device)]
    if args.json is not None:
        peak = device_peak_flops(device, low_precision=True)
        write_json(args.json, {"device": name, "torch": torch.__version__,
                               "peak_bf16_tflops": peak / 1e12 if peak else None, "runs": records})
    return 0


if __name__ == "__main__":
    sys.exit(main())
