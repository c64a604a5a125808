"""T5 at degree 1: our training step (T5 dataset -> collate -> T5 -> loss -> clip -> AdamW) versus a
plain PyTorch loop over the same model, batch shape and optimiser; plus T5 sample-building throughput.

"Ours" reads its micro-batches from the span-corruption dataset (`samplers.t5.dataset`) through the
trainer's prefetch thread (`trainer.data.batches.Prefetcher`), clips with the trainer's DTensor-aware global
norm (`trainer.optim.grads`) and runs AdamW with Megatron's parameter groups (`trainer.optim.optimizer`); the
baseline trains on batches already in memory with `clip_grad_norm_` and one AdamW group. Steps alternate between the two (both
see the same load); a round's figure is its median step time, the reported one the median of rounds.

    python -m benchmarks.t5_step                 # tokens/s of both, the ratio, sample building rate
    python -m benchmarks.t5_step --rounds 5 --steps 10 --d-model 512

It also times the global gradient norm alone on the model's last gradients (median of 7): ours,
the float64 upcast it replaced, and PyTorch's float32 `get_total_norm`, with their errors.

Target: ratio >= 0.95.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from indexed_dataset import IndexedDatasetWriter
from samplers.t5.dataset import T5DatasetConfig, build_t5_datasets
from trainer.config import OptimizerConfig
from trainer.data.batches import Prefetcher
from trainer.optim.grads import clip_factor, global_grad_norm, scale_grads
from trainer.optim.optimizer import build_optimizer
from trainer.models.t5.data import IGNORE_INDEX, collate_t5
from trainer.models.t5.model import T5, T5Shape

WORDS, NUM_SENTINELS = 32000, 100
VOCAB = 32128  # T5's padded vocabulary
NUM_DOCUMENTS = 20000
WARMUP_STEPS = 1
SAMPLE_RATE_ITEMS = 2000
CLIP = 1.0
# T5's attention head size (d_kv): --d-model is a whole number of heads.
HEAD_DIM = 64
NORM_REPEATS = 7


def write_corpus(directory: Path) -> str:
    """A sentence-split corpus: 20k documents of 1-15 sentences of 5-40 random word ids."""
    rng = np.random.default_rng(0)
    counts = rng.integers(1, 16, size=NUM_DOCUMENTS)
    lengths = rng.integers(5, 41, size=int(counts.sum()))
    tokens = rng.integers(2, WORDS, size=int(lengths.sum()), dtype=np.uint16)
    with IndexedDatasetWriter(str(directory / "corpus_text_sentence"), np.uint16) as writer:
        writer.add_documents(tokens, lengths, counts)
    return str(directory / "corpus_text_sentence")


def loss_of(model: T5, batch) -> torch.Tensor:
    logits = model(batch.encoder_input_ids, batch.decoder_input_ids, batch.encoder_attention_mask)
    return F.cross_entropy(logits.flatten(0, 1), batch.targets.flatten(), ignore_index=IGNORE_INDEX)


def ours_step(model, optimizer, batches: Prefetcher) -> float:
    """Seconds of one step of ours: take the next micro-batch from the prefetch thread, train on it."""
    params = list(model.parameters())
    begin = time.perf_counter()
    batch = next(batches)
    optimizer.zero_grad(set_to_none=True)
    loss_of(model, batch).backward()
    scale_grads(params, clip_factor(global_grad_norm(params, None).total, CLIP))
    optimizer.step()
    return time.perf_counter() - begin


def plain_step(model, optimizer, batch) -> float:
    """Seconds of one step of the baseline on a batch already in memory."""
    begin = time.perf_counter()
    optimizer.zero_grad(set_to_none=True)
    loss_of(model, batch).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
    optimizer.step()
    return time.perf_counter() - begin


def norm_timings(params: list[torch.nn.Parameter], repeats: int) -> dict[str, tuple[float, float]]:
    """Median ms and relative difference to an exact float64 norm of: ours (`global_grad_norm`), every
    gradient upcast to float64 and squared (what it did before), and `get_total_norm` (float32)."""
    grads = [p.grad for p in params]
    exact = float(sum(g.to(torch.float64).pow(2).sum() for g in grads).sqrt())
    candidates = {
        "ours (float32 per-tensor norms, float64 sum)": lambda: global_grad_norm(params, None).total,
        "float64 upcast and square": lambda: sum(g.to(torch.float64).pow(2).sum() for g in grads).sqrt(),
        "get_total_norm (float32)": lambda: torch.nn.utils.get_total_norm(grads),
    }
    timings = {}
    for name, function in candidates.items():
        seconds = []
        for _ in range(repeats):
            begin = time.perf_counter()
            value = float(function())
            seconds.append(time.perf_counter() - begin)
        timings[name] = (1e3 * statistics.median(seconds), abs(value - exact) / exact)
    return timings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=5, help="measured steps per round")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--encoder-length", type=int, default=128)
    parser.add_argument("--decoder-length", type=int, default=32)
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2, help="encoder and decoder layers each")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (1: steadier on a shared box)")
    args = parser.parse_args()
    if args.d_model < HEAD_DIM or args.d_model % HEAD_DIM:
        parser.error(f"--d-model must be a multiple of the head size {HEAD_DIM}, got {args.d_model}")
    for flag, value in (("--rounds", args.rounds), ("--steps", args.steps), ("--batch-size", args.batch_size),
                        ("--encoder-length", args.encoder_length), ("--decoder-length", args.decoder_length),
                        ("--layers", args.layers), ("--threads", args.threads)):
        if value < 1:
            parser.error(f"{flag} must be at least 1, got {value}")
    torch.set_num_threads(args.threads)

    with tempfile.TemporaryDirectory() as tmp:
        prefix = write_corpus(Path(tmp))
        per_round = (WARMUP_STEPS + args.steps) * 2 * args.batch_size
        config = T5DatasetConfig(data_prefix=prefix, split="100,0,0", encoder_seq_length=args.encoder_length,
                                 decoder_seq_length=args.decoder_length,
                                 sentinel_ids=tuple(range(VOCAB - 1, VOCAB - 1 - NUM_SENTINELS, -1)),
                                 pad_id=0, decoder_start_id=0, eos_id=1, path_to_cache=str(Path(tmp) / "cache"))
        begin = time.perf_counter()
        train = build_t5_datasets(config, sizes=(args.rounds * per_round + SAMPLE_RATE_ITEMS, None, None))[0]
        index_seconds = time.perf_counter() - begin
        begin = time.perf_counter()
        for i in range(SAMPLE_RATE_ITEMS):
            train[i]
        samples_per_s = SAMPLE_RATE_ITEMS / (time.perf_counter() - begin)
        print(f"sample index: {len(train)} samples over {NUM_DOCUMENTS} documents built in {index_seconds:.2f} s "
              "(includes numba JIT on a cold cache)")
        print(f"sample building: {samples_per_s:.0f} samples/s "
              f"({samples_per_s * args.encoder_length:.0f} encoder positions/s), one thread")

        shape = T5Shape(vocab_size=VOCAB, d_model=args.d_model, d_kv=HEAD_DIM, d_ff=4 * args.d_model,
                        num_heads=args.d_model // HEAD_DIM, num_encoder_layers=args.layers,
                        num_decoder_layers=args.layers, feed_forward="gated-gelu", tie_word_embeddings=False,
                        scale_decoder_outputs=False)
        torch.manual_seed(0)
        ours_model = T5(shape)
        plain_model = T5(shape)
        plain_model.load_state_dict(ours_model.state_dict())
        optim = OptimizerConfig(lr=1e-4, weight_decay=0.01)
        # foreach=None: PyTorch's default kernels, what the trainer asks for without DTensors.
        ours_opt = build_optimizer(list(ours_model.named_parameters()), optim, foreach=None)
        plain_opt = torch.optim.AdamW(plain_model.parameters(), lr=optim.lr, weight_decay=optim.weight_decay,
                                      betas=(optim.adam_beta1, optim.adam_beta2), eps=optim.adam_eps)
        tokens_per_step = args.batch_size * (args.encoder_length + args.decoder_length)
        ours, plain = [], []
        for round_id in range(args.rounds):
            # Steps alternate between the two sides so both see the same load on a shared machine.
            ours_times, plain_times = [], []
            firsts = [round_id * per_round + step * 2 * args.batch_size for step in range(WARMUP_STEPS + args.steps)]
            ours_batches = Prefetcher(collate_t5([train[i] for i in range(first, first + args.batch_size)], VOCAB)
                                      for first in firsts)
            for first in firsts:
                ours_times.append(ours_step(ours_model, ours_opt, ours_batches))
                batch = collate_t5([train[i] for i in range(first + args.batch_size, first + 2 * args.batch_size)],
                                   VOCAB)
                plain_times.append(plain_step(plain_model, plain_opt, batch))
            ours_batches.close()
            ours.append(statistics.median(ours_times[WARMUP_STEPS:]))
            plain.append(statistics.median(plain_times[WARMUP_STEPS:]))
        ours_tps, plain_tps = tokens_per_step / statistics.median(ours), tokens_per_step / statistics.median(plain)
        print(f"model: d_model {args.d_model}, {args.layers}+{args.layers} layers, batch {args.batch_size} x "
              f"({args.encoder_length} + {args.decoder_length}) positions, {args.rounds} rounds x {args.steps} steps")
        print(f"ours : {ours_tps:9.0f} tokens/s  (round medians {[f'{t * 1e3:.0f} ms' for t in ours]})")
        print(f"plain: {plain_tps:9.0f} tokens/s  (round medians {[f'{t * 1e3:.0f} ms' for t in plain]})")
        print(f"ratio ours/plain: {ours_tps / plain_tps:.3f}  (target >= 0.95)")
        for name, (ms, error) in norm_timings(list(ours_model.parameters()), NORM_REPEATS).items():
            print(f"gradient norm, {name}: {ms:.1f} ms, relative difference to exact {error:.1e}")


if __name__ == "__main__":
    main()
