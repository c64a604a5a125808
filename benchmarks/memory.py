"""Per-rank model-state bytes of each ZeRO stage (`trainer.zero`) against the ZeRO paper's formulas, and the
step time of each stage next to stage 0's, from one run of ``train --print-memory`` per stage.

A GPT of Ψ parameters (activations small against its model states) trains a few steps on N gloo CPU ranks
(pure data parallelism), in fp32 and in bf16 autocast, at stages 0-3 and with the optimiser offloaded. Each
rank's ``memory`` record (`trainer.memory_report`) gives parameters + gradients + optimiser state bytes.

    python -m benchmarks.memory                      # 4 ranks, hidden 128, 4 layers (about 0.9 M parameters)
    python -m benchmarks.memory --hidden-size 256

Formulas (bytes per rank): the paper's mixed precision (fp16 weights and gradients, fp32 master weights and
Adam moments: K = 12) 16Ψ, 4Ψ + 12Ψ/N, 2Ψ + 14Ψ/N, 16Ψ/N; ours keeps fp32 weights and gradients under
autocast (bf16 computes from them), so 16Ψ, 8Ψ + 8Ψ/N, 16Ψ/N (stage 2 at rest: FSDP2 frees the gathered
weights after backward; 4Ψ + 12Ψ/N during forward/backward), 16Ψ/N. AdamW's step counters add 4 bytes per
parameter tensor.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import tempfile
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from indexed_dataset import IndexedDatasetWriter
from trainer.config import (DataConfig, LoggingConfig, ModelConfig, OptimizerConfig, ParallelismConfig,
                            PrecisionConfig, TrainConfig, TrainingConfig)
from trainer.metrics_records import read_run
from trainer.models.gpt.model import GPT, GPTShape
from trainer.train import train

VOCAB = 1024
SEQ = 32
DOCUMENTS = 400
DOCUMENT_TOKENS = 200
# (label, ZeRO stage, offload) of each measured run.
RUNS = (("stage 0", 0, False), ("stage 1", 1, False), ("stage 2", 2, False), ("stage 3", 3, False),
        ("stage 1 + offload", 1, True), ("stage 2 + offload", 2, True), ("stage 3 + offload", 3, True))


def paper_formula(stage: int, n: int) -> float:
    """The ZeRO paper's model-state bytes per parameter at ``stage`` (mixed precision, K = 12)."""
    return {0: 16, 1: 4 + 12 / n, 2: 2 + 14 / n, 3: 16 / n}[stage]


def fp32_formula(stage: int, n: int) -> float:
    """Ours: fp32 weights and gradients, fp32 AdamW moments (stage 2 at rest, after the step)."""
    return {0: 16, 1: 8 + 8 / n, 2: 16 / n, 3: 16 / n}[stage]


def write_data(prefix: str) -> None:
    """Random documents of a VOCAB-token vocabulary (the loss does not matter here)."""
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, VOCAB, DOCUMENTS * DOCUMENT_TOKENS, dtype=np.uint16)
    lengths = np.full(DOCUMENTS, DOCUMENT_TOKENS, dtype=np.int64)
    with IndexedDatasetWriter(prefix, np.uint16) as writer:
        writer.add_documents(tokens, lengths, np.ones(DOCUMENTS, dtype=np.int64))


def run_config(args: argparse.Namespace, prefix: str, metrics: str, stage: int, offload: bool,
               bf16: bool) -> TrainConfig:
    return TrainConfig(
        model=ModelConfig(num_layers=args.num_layers, hidden_size=args.hidden_size, num_attention_heads=4,
                          seq_length=SEQ, vocab_size=VOCAB, make_vocab_size_divisible_by=64, hidden_dropout=0.0,
                          attention_dropout=0.0),
        data=DataConfig(dataset=[prefix], split="100,0,0", data_cache_path=str(Path(prefix).parent)),
        training=TrainingConfig(micro_batch_size=1, global_batch_size=args.ranks, train_iters=args.steps,
                                device=args.device),
        precision=PrecisionConfig(bf16=bf16),
        optimizer=OptimizerConfig(lr=1e-4),
        parallelism=ParallelismConfig(zero_stage=stage, cpu_offload=offload),
        logging=LoggingConfig(log_interval=1, eval_iters=0, metrics_file=metrics, print_memory=True),
    )


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _worker(rank: int, args: argparse.Namespace, port: int, prefix: str, workdir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(args.ranks), LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    if args.device == "cuda":
        torch.cuda.set_device(rank)
    dist.init_process_group("nccl" if args.device == "cuda" else "gloo", rank=rank, world_size=args.ranks)
    try:
        for bf16 in (False, True):
            for label, stage, offload in RUNS:
                metrics = str(Path(workdir) / f"{label}-{bf16}.jsonl".replace(" ", "_"))
                if args.device == "cuda":  # each run's own peak (a CPU's peak RSS is the process's so far)
                    torch.cuda.empty_cache()
                    torch.cuda.reset_peak_memory_stats()
                train(run_config(args, prefix, metrics, stage, offload, bf16))
    finally:
        dist.destroy_process_group()


def summarise(args: argparse.Namespace, workdir: str) -> list[dict]:
    """One row per (precision, run): the largest rank's model-state bytes and the median step time."""
    rows = []
    for bf16 in (False, True):
        for label, stage, offload in RUNS:
            run = read_run(Path(workdir) / f"{label}-{bf16}.jsonl".replace(" ", "_"))
            ranks = run.memory[0]["memory"]
            states = max(sum(r[k] for k in r if k.endswith(("_device", "_cpu"))) for r in ranks)
            optimizer_device = max(r["optimizer_device"] for r in ranks)
            step_ms = statistics.median(record["ms_per_iteration"] for record in run.train[1:])
            rows.append({"precision": "bf16" if bf16 else "fp32", "run": label, "stage": stage, "offload": offload,
                         "model_state_bytes": states, "optimizer_device_bytes": optimizer_device,
                         "peak_bytes": max(r["peak_bytes"] for r in ranks), "step_ms": step_ms})
    return rows


def parameter_count(args: argparse.Namespace) -> int:
    """Ψ of the benchmarked GPT, from the model's own definition on the meta device (not from the report)."""
    shape = GPTShape(num_layers=args.num_layers, hidden_size=args.hidden_size, num_attention_heads=4,
                     ffn_hidden_size=4 * args.hidden_size, max_position_embeddings=SEQ, padded_vocab_size=VOCAB)
    with torch.device("meta"):
        return sum(p.numel() for p in GPT(shape).parameters())


def print_table(rows: list[dict], n: int, psi: int) -> None:
    print(f"Ψ = {psi} parameters, N = {n} ranks")
    print("| precision | run | bytes/rank (MB) | bytes/Ψ | ours (fp32 formula) | paper (mixed) | optimizer on device "
          "(MB) | peak (MB) | step ms | vs stage 0 |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        base = next(r for r in rows if r["precision"] == row["precision"] and r["stage"] == 0)
        print(f"| {row['precision']} | {row['run']} | {row['model_state_bytes'] / 1e6:.2f} | "
              f"{row['model_state_bytes'] / psi:.2f} | {fp32_formula(row['stage'], n):.2f} | "
              f"{paper_formula(row['stage'], n):.2f} | {row['optimizer_device_bytes'] / 1e6:.2f} | "
              f"{row['peak_bytes'] / 1e6:.0f} | {row['step_ms']:.1f} | {row['step_ms'] / base['step_ms']:.2f} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--hidden-size", type=int, default=128)
    parser.add_argument("--num-layers", type=int, default=4)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="cuda: one GPU per rank (peak = max_memory_allocated)")
    parser.add_argument("--json", help="also write the rows here")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as workdir:
        prefix = str(Path(workdir) / "random_text_document")
        write_data(prefix)
        mp.start_processes(_worker, args=(args, _free_port(), prefix, workdir), nprocs=args.ranks,
                           start_method="spawn")
        rows = summarise(args, workdir)
    print_table(rows, args.ranks, parameter_count(args))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
