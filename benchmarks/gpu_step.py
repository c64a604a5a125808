"""Training-step throughput on one GPU: our runner versus a plain PyTorch loop, same model, batch and precision.

Models (``--model``): OneFlow's GPT-345M (24 layers, hidden 1024, 16 heads, seq 1024, micro-batch 4)
and LiBai's mT5-base (12+12 layers, d_model 768, 12 heads of 64, gated-GELU d_ff 2048, vocabulary
250112, tied head; encoder 512, decoder 128 positions, micro-batch 16); bf16 autocast over fp32
weights on both sides; no dropout (the two sides draw no random numbers, so their losses match).

- ours: the trainer's `ParallelModel` of the family (its autocast, loss and, with ``--compile``, its
  per-block torch.compile), the AdamW kernel `trainer.optim.select_adamw_kernel` picks (fused on
  CUDA), the trainer's global gradient norm and clipping;
- plain: the same model class with the same initial weights, ``torch.autocast``, cross-entropy,
  ``clip_grad_norm_`` and ``torch.optim.AdamW(fused=True)``; with ``--compile``, ``torch.compile`` of
  the whole model. Attention is ``scaled_dot_product_attention`` in both (the models call it).

Each side trains ``--warmup`` steps (compilation happens there), then ``--steps`` timed steps on
batches already on the device; it reports tokens/s, samples/s, model TFLOP/s (the trainer's FLOP
counts), MFU against the device's bf16 peak (`trainer.metrics.PEAK_FLOPS`) and peak memory. The
sides run one after the other, each freed before the next is built, so each peak is its own.

    python -m benchmarks.gpu_step                          # both models, eager, on the CUDA device
    python -m benchmarks.gpu_step --compile                # the same, torch.compile
    python -m benchmarks.gpu_step --model gpt --steps 20
    python -m benchmarks.gpu_step --tiny --device cpu --steps 2    # end-to-end check of the script on a CPU

Without a CUDA device (and without ``--device cpu``) it prints one line and exits with status 2.
Target: ours/plain >= 0.95.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from trainer.config import OptimizerConfig, ParallelismConfig
from trainer.data import IGNORE_INDEX
from trainer.models.gpt.data import GPTMicroBatch
from trainer.grads import clip_factor, global_grad_norm, scale_grads
from trainer.metrics import device_peak_flops
from trainer.models import model_spec
from trainer.models.gpt.model import GPT, GPTShape
from trainer.models.gpt.training import flops_per_token as gpt_flops_per_token
from trainer.models.t5.data import T5MicroBatch
from trainer.models.t5.model import T5, T5Shape
from trainer.models.t5.training import flops_per_token as t5_flops_per_token
from trainer.optim import ADAMW_KERNEL_OPTIONS, build_optimizer, select_adamw_kernel
from trainer.parallel_dims import ParallelDims, pad_vocab_size
from trainer.runner import ParallelModel

EXIT_NO_CUDA = 2
SEED = 1234
GIB = 2**30
CLIP_GRAD = 1.0
OPTIMIZER = OptimizerConfig(lr=1e-4, weight_decay=0.01)
# GPT-2's 50257 tokens padded to a multiple of 128, as Megatron (and OneFlow's 345M config) do.
GPT2_VOCAB = 50257
VOCAB_DIVISIBLE_BY = 128
MT5_VOCAB = 250112


@dataclass(frozen=True, slots=True)
class Workload:
    """One model of the benchmark: its family, shape, batch shape and costs."""

    family: str
    """`trainer.models` family name."""
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
    return Workload(family="gpt", shape=shape, build=GPT, micro_batch_size=micro_batch, lengths=(seq,),
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
    return Workload(family="t5", shape=shape, build=T5, micro_batch_size=micro_batch, lengths=lengths,
                    flops_per_token=t5_flops_per_token(shape, *lengths))


WORKLOADS = {"gpt": gpt_workload, "t5": t5_workload}


@dataclass(frozen=True, slots=True)
class SideResult:
    """What one side measured over its timed steps."""

    seconds: float
    """Wall time of the timed steps."""
    last_loss: float
    peak_memory_bytes: int | None
    """None on a CPU."""


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(device: torch.device, warmup: int, steps: int, step: Callable[[int], torch.Tensor]) -> SideResult:
    """Run ``warmup`` then ``steps`` steps of ``step(index) -> loss``; time the latter."""
    for index in range(warmup):
        step(index)
    _synchronize(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    begin = time.perf_counter()
    for index in range(warmup, warmup + steps):
        loss = step(index)
    _synchronize(device)
    seconds = time.perf_counter() - begin
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
    return SideResult(seconds=seconds, last_loss=float(loss), peak_memory_bytes=peak)


def run_ours(work: Workload, batches: list, device: torch.device, warmup: int, steps: int,
             compile_blocks: bool) -> tuple[SideResult, dict[str, torch.Tensor]]:
    """Our side; also returns its initial weights (on the CPU) for the plain side to start from."""
    dims = ParallelDims(pp=1, dp=1, tp=1, micro_batch_size=work.micro_batch_size, num_microbatches=1)
    model = ParallelModel(model_spec(work.family).parallel_plan, work.shape, dims, None, ParallelismConfig(), device,
                          SEED, False, torch.bfloat16, compile_blocks=compile_blocks)
    initial = {name: p.detach().to("cpu", copy=True) for name, p in model.named_parameters()}
    params = [p for _, p in model.named_parameters()]
    kernel = select_adamw_kernel(device.type, params)
    optimizer = build_optimizer(model.named_parameters(), OPTIMIZER, **ADAMW_KERNEL_OPTIONS[kernel])
    model.set_train(True)

    def step(index: int) -> torch.Tensor:
        # `trainer.train`'s step without fp16 loss scaling.
        optimizer.zero_grad(set_to_none=True)
        loss, _ = model.run([batches[index % len(batches)]], train=True)
        norm = global_grad_norm(model.norm_parameters(), None)
        scale_grads(params, clip_factor(float(norm), CLIP_GRAD))
        optimizer.step()
        return loss

    return _timed(device, warmup, steps, step), initial


def run_plain(work: Workload, batches: list, device: torch.device, warmup: int, steps: int, compile_model: bool,
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

    return _timed(device, warmup, steps, step)


def _free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def report(name: str, work: Workload, side: SideResult, steps: int, peak_flops: float | None) -> float:
    """Print one side's line; returns its tokens/s."""
    samples_per_s = steps * work.micro_batch_size / side.seconds
    tokens_per_s = samples_per_s * work.tokens_per_sample
    tflops = tokens_per_s * work.flops_per_token / 1e12
    mfu = f"{100 * tflops * 1e12 / peak_flops:5.1f}%" if peak_flops else "  n/a"
    memory = f"{side.peak_memory_bytes / GIB:6.2f} GiB" if side.peak_memory_bytes is not None else "   n/a"
    print(f"  {name:5s}: {tokens_per_s:12,.0f} tokens/s  {samples_per_s:9.2f} samples/s  {tflops:8.2f} TFLOP/s  "
          f"MFU {mfu}  peak memory {memory}  last loss {side.last_loss:.4f}")
    return tokens_per_s


def benchmark(family: str, args: argparse.Namespace, device: torch.device) -> float:
    """Both sides of one model; prints their figures and returns ours/plain (tokens/s)."""
    work = WORKLOADS[family](args.tiny)
    generator = torch.Generator().manual_seed(SEED)
    batches = [work.batch(generator, device) for _ in range(args.batches)]
    mode = "compile" if args.compile else "eager"
    print(f"{family} ({'tiny' if args.tiny else 'full'}): micro-batch {work.micro_batch_size} x "
          f"{' + '.join(map(str, work.lengths))} positions, bf16 autocast, {mode}, {args.warmup} warm-up + "
          f"{args.steps} timed steps")
    ours, initial = run_ours(work, batches, device, args.warmup, args.steps, args.compile)
    _free(device)
    plain = run_plain(work, batches, device, args.warmup, args.steps, args.compile, initial)
    _free(device)
    peak = device_peak_flops(device, low_precision=True)
    ours_tps = report("ours", work, ours, args.steps, peak)
    plain_tps = report("plain", work, plain, args.steps, peak)
    ratio = ours_tps / plain_tps
    print(f"  ratio ours/plain: {ratio:.3f} (target >= 0.95)")
    return ratio


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", choices=(*WORKLOADS, "all"), default="all")
    parser.add_argument("--compile", action="store_true",
                        help="torch.compile: ours per block (train --compile), plain the whole model")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per side")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first (compilation happens here)")
    parser.add_argument("--batches", type=int, default=4, help="distinct random micro-batches, used in turn")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--tiny", action="store_true", help="tiny shapes of both models (checks the script)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_step: no CUDA device is available (use --tiny --device cpu to check the script on a CPU)",
              file=sys.stderr)
        return EXIT_NO_CUDA
    device = torch.device(args.device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"device: {name}; torch {torch.__version__}")
    for family in WORKLOADS if args.model == "all" else (args.model,):
        benchmark(family, args, device)
    return 0


if __name__ == "__main__":
    sys.exit(main())
