"""Trainer overhead at degree 1: `train` versus a minimal PyTorch loop, same model, batch and optimiser.

Both sides train the same GPT (trainer.models.gpt.model.GPT) with AdamW and gradient clipping on the same batch
shape in this process. `train` reads its batches from a token file through the samplers and its
prefetch thread; the baseline loop trains on batches already in memory. Rounds alternate between the
two; each round's figure is the median step time over its measured steps (warm-up steps dropped).

    python -m benchmarks.train_step            # prints tokens/s of both, the ratio, and data time per step
    python -m benchmarks.train_step --rounds 5 --steps 30
    python -m benchmarks.train_step --llama        # a Llama-shaped decoder (RMSNorm, SwiGLU, rotary, GQA)

Targets: ratio >= 0.95; data loading time < 5% of the step time.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from indexed_dataset import IndexedDataset, IndexedDatasetWriter
from indexed_dataset.cli_parser import finite_float
from trainer.config import (
    DataConfig,
    LoggingConfig,
    ModelConfig,
    OptimizerConfig,
    ParallelismConfig,
    TrainConfig,
    TrainingConfig,
)
from trainer.models.gpt.model import GPT
from trainer.optim.optimizer import build_optimizer
from trainer.models.gpt.training import model_shape
from trainer.train import train

GOLDEN = Path(__file__).resolve().parent.parent / "data_test" / "megatron" / "sample_en_eod_text_document"
VOCAB = 8192
WARMUP_STEPS = 3


# The Llama-class switches of `--llama` (Megatron's Llama 3 flags): RMSNorm, SwiGLU, rotary positions, no biases,
# grouped-query attention with this many query heads per key/value group.
LLAMA_OPTIONS = dict(normalization="RMSNorm", swiglu=True, position_embedding_type="rope", disable_bias_linear=True,
                     group_query_attention=True)
LLAMA_HEADS_PER_GROUP = 2


def benchmark_config(prefix: str, cache: str, metrics: str, steps: int, args: argparse.Namespace) -> TrainConfig:
    llama = dict(LLAMA_OPTIONS, num_query_groups=args.heads // LLAMA_HEADS_PER_GROUP) if args.llama else {}
    return TrainConfig(
        model=ModelConfig(num_layers=args.layers, hidden_size=args.hidden, num_attention_heads=args.heads,
                          seq_length=args.seq, vocab_size=VOCAB, hidden_dropout=args.dropout,
                          attention_dropout=args.dropout, **llama),
        parallelism=ParallelismConfig(keyed_dropout=args.keyed_dropout),
        data=DataConfig(dataset=[prefix], split="100,0,0", data_cache_path=cache),
        training=TrainingConfig(micro_batch_size=args.batch, global_batch_size=args.batch, train_iters=steps,
                                device="cpu"),
        optimizer=OptimizerConfig(lr=1e-4, clip_grad=1.0, lr_decay_style="constant"),
        logging=LoggingConfig(log_interval=1, eval_iters=0, metrics_file=metrics),
    )


def run_trainer(config: TrainConfig, metrics: Path) -> tuple[list[float], float]:
    """Step seconds (warm-up dropped) and the median data-wait seconds of one `train` run."""
    metrics.unlink(missing_ok=True)
    train(config)
    records = [json.loads(line) for line in metrics.read_text().splitlines()][WARMUP_STEPS:]
    return ([r["ms_per_iteration"] / 1000 for r in records],
            statistics.median(r["data_ms_per_iteration"] for r in records) / 1000)


def run_baseline(config: TrainConfig, steps: int) -> list[float]:
    """Step seconds (warm-up dropped) of a plain loop: forward, cross-entropy, backward, clip, AdamW step."""
    torch.manual_seed(config.data.seed)
    model = GPT(model_shape(config, VOCAB, tp=1))
    optimizer = build_optimizer(list(model.named_parameters()), config.optimizer, foreach=None)
    batch, seq = config.training.micro_batch_size, config.model.seq_length
    tokens = torch.randint(0, VOCAB, (steps, batch, seq + 1))
    positions = torch.arange(seq).expand(batch, seq)
    times = []
    for step in range(steps):
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        logits = model(tokens[step, :, :-1], positions)
        loss = F.cross_entropy(logits.flatten(0, 1), tokens[step, :, 1:].flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.optimizer.clip_grad)
        optimizer.step()
        loss.item()
        times.append(time.perf_counter() - start)
    return times[WARMUP_STEPS:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=15, help="steps per run, of which 3 are warm-up")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--dropout", type=finite_float, default=0.0, help="hidden and attention dropout of both sides")
    parser.add_argument("--keyed-dropout", action="store_true",
                        help="train with --keyed-dropout (the plain loop keeps nn.Dropout)")
    parser.add_argument("--llama", action="store_true",
                        help="a Llama-shaped decoder on both sides: RMSNorm, SwiGLU, rotary, no biases, grouped-query "
                             f"attention ({LLAMA_HEADS_PER_GROUP} query heads per group)")
    parser.add_argument("--threads", type=int, default=1,
                        help="intra-op threads for both sides (1, as torchrun gives each of several CPU processes)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        source = IndexedDataset(str(GOLDEN))
        prefix = f"{tmp}/bench_text_document"
        with IndexedDatasetWriter(prefix, np.uint16) as writer:
            writer.add_documents((source.tokens % VOCAB).astype(np.uint16), source.sequence_lengths.astype(np.int64),
                                 np.diff(source.document_indices))
        metrics = Path(tmp) / "metrics.jsonl"
        config = benchmark_config(prefix, f"{tmp}/cache", str(metrics), args.steps, args)
        tokens_per_step = args.batch * args.seq
        trainer_steps, data_waits, baseline_steps, fastest = [], [], [], {"train": [], "plain": []}
        for round_index in range(args.rounds):
            steps, data = run_trainer(config, metrics)
            base_steps = run_baseline(config, args.steps)
            step, base = statistics.median(steps), statistics.median(base_steps)
            trainer_steps.append(step)
            data_waits.append(data)
            baseline_steps.append(base)
            fastest["train"].append(min(steps))
            fastest["plain"].append(min(base_steps))
            print(f"round {round_index + 1}: train {tokens_per_step / step:,.0f} tok/s, "
                  f"plain loop {tokens_per_step / base:,.0f} tok/s, ratio {base / step:.3f}, "
                  f"data wait {1000 * data:.2f} ms/step")
    trainer_tps = tokens_per_step / statistics.median(trainer_steps)
    baseline_tps = tokens_per_step / statistics.median(baseline_steps)
    data_fraction = statistics.median(data_waits) / statistics.median(trainer_steps)
    print(f"model: {'Llama-shaped, ' if args.llama else ''}{args.layers} layers, hidden {args.hidden}, seq {args.seq}, "
          f"batch {args.batch}, vocab {VOCAB}; "
          f"threads {torch.get_num_threads()}")
    print(f"train      : {trainer_tps:,.0f} tokens/s (median of {args.rounds})")
    print(f"plain loop : {baseline_tps:,.0f} tokens/s (median of {args.rounds})")
    # Each round runs both sides back to back, so its ratio sees the same background load; the median
    # of the per-round ratios is the headline figure, the ratio of the medians is shown beside it.
    paired = statistics.median(base / step for base, step in zip(baseline_steps, trainer_steps))
    print(f"ratio      : {paired:.3f} median of per-round ratios (target >= 0.95); "
          f"ratio of medians {trainer_tps / baseline_tps:.3f}")
    print(f"data wait  : {100 * data_fraction:.2f}% of the step time (target < 5%)")
    # On a shared machine other load inflates some steps; the fastest steps show the overhead itself.
    print(f"ratio of the fastest steps (noise check): {min(fastest['plain']) / min(fastest['train']):.3f}")


if __name__ == "__main__":
    main()
