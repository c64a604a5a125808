"""Per-rank model-state bytes of each ZeRO stage (`trainer.parallel.zero`) against the ZeRO paper's formulas, between
steps and at their peak within a step, and the step time of each stage next to stage 0's, from one run of
``train --print-memory`` per stage.

A GPT of Ψ parameters (activations small against its model states) trains a few steps on N gloo CPU ranks
(pure data parallelism, one micro-batch per step), in fp32 and in bf16 autocast, at stages 0-3 and with the
optimiser offloaded. Two figures per rank, the largest rank's shown:
- between steps: the ``memory`` record after the first step (`trainer.metrics.memory_report.measure_memory`):
  parameters + gradients + optimiser state;
- peak in step: the largest of `trainer.metrics.memory_report.StepStateSampler`'s samples (end of forward, end of
  backward, before and after the optimiser step) of the steps after the first, which also counts FSDP2's
  gathered weights and autocast's bf16 casts of the weights (at the end of forward).

    python -m benchmarks.memory                      # 4 ranks, hidden 128, 4 layers (about 0.9 M parameters)
    python -m benchmarks.memory --steps 2            # quicker: one step after the first (the peak needs two)

Formulas (bytes per rank): the paper's mixed precision (fp16 weights and gradients, fp32 master weights and
Adam moments: K = 12) 16Ψ, 4Ψ + 12Ψ/N, 2Ψ + 14Ψ/N, 16Ψ/N. Ours keeps fp32 weights and gradients under
autocast (bf16 computes from them): between steps 16Ψ, 8Ψ + 8Ψ/N, 16Ψ/N, 16Ψ/N; at the peak in fp32 16Ψ,
8Ψ + 8Ψ/N, 4Ψ + 12Ψ/N (stage 2's gathered weights at the end of forward), 16Ψ/N, and under bf16 autocast the
same but stage 2's 2Ψ + 12Ψ/N (FSDP2 gathers bf16 weights). Autocast's casts of the weights (2Ψc; Ψc: all but the
position table and the norms) live from the forward until the backward has used them: at stages 0-1 the end of
forward holds them, below the end of backward's peak. AdamW's step counters add 4 bytes per tensor.
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
from trainer.metrics.memory_report import StepStateSampler
from trainer.metrics.records import read_run
from trainer.models.gpt.model import GPT, GPTShape
from trainer.train import train

VOCAB = 1024
SEQ = 32
DOCUMENTS = 400
DOCUMENT_TOKENS = 200
# The first step creates AdamW's moments in its optimiser step: the peak in a step is taken from the second on.
MIN_STEPS = 2
# (label, ZeRO stage, offload) of each measured run.
RUNS = (("stage 0", 0, False), ("stage 1", 1, False), ("stage 2", 2, False), ("stage 3", 3, False),
        ("stage 1 + offload", 1, True), ("stage 2 + offload", 2, True), ("stage 3 + offload", 3, True))


def paper_formula(stage: int, n: int) -> float:
    """The ZeRO paper's model-state bytes per parameter at ``stage`` (mixed precision, K = 12)."""
    return {0: 16, 1: 4 + 12 / n, 2: 2 + 14 / n, 3: 16 / n}[stage]


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


def _run_file(workdir: str, label: str, bf16: bool, suffix: str) -> Path:
    """A run's file in ``workdir`` (``.jsonl``: its metrics; ``.rank<r>.json``: rank r's peak sample)."""
    return Path(workdir) / f"{label}-{bf16}{suffix}".replace(" ", "_")


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
                metrics = str(_run_file(workdir, label, bf16, ".jsonl"))
                if args.device == "cuda":  # each run's own peak (a CPU's peak RSS is the process's so far)
                    torch.cuda.empty_cache()
                    torch.cuda.reset_peak_memory_stats()
                with StepStateSampler(torch.device(args.device), torch.bfloat16 if bf16 else None) as sampler:
                    train(run_config(args, prefix, metrics, stage, offload, bf16))
                peak = sampler.peak()
                _run_file(workdir, label, bf16, f".rank{rank}.json").write_text(
                    json.dumps({"point": peak.point, "bytes": peak.total()}))
    finally:
        dist.destroy_process_group()


def summarise(args: argparse.Namespace, workdir: str) -> list[dict]:
    """One row per (precision, run): the largest rank's model-state bytes between steps and at its peak within
    a step (and the point of that peak), and the median step time."""
    rows = []
    for bf16 in (False, True):
        for label, stage, offload in RUNS:
            run = read_run(_run_file(workdir, label, bf16, ".jsonl"))
            ranks = run.memory[0]["memory"]
            states = max(sum(r[k] for k in r if k.endswith(("_device", "_cpu"))) for r in ranks)
            optimizer_device = max(r["optimizer_device"] for r in ranks)
            peaks = [json.loads(_run_file(workdir, label, bf16, f".rank{rank}.json").read_text())
                     for rank in range(args.ranks)]
            peak = max(peaks, key=lambda p: p["bytes"])
            step_ms = statistics.median(record["ms_per_iteration"] for record in run.train[1:])
            rows.append({"precision": "bf16" if bf16 else "fp32", "run": label, "stage": stage, "offload": offload,
                         "model_state_bytes": states, "peak_state_bytes": peak["bytes"], "peak_point": peak["point"],
                         "optimizer_device_bytes": optimizer_device,
                         "peak_bytes": max(r["peak_bytes"] for r in ranks), "step_ms": step_ms})
    return rows


def parameter_count(args: argparse.Namespace) -> int:
    """Ψ of the benchmarked GPT, from the model's own definition on the meta device (not from the report)."""
    shape = GPTShape(num_layers=args.num_layers, hidden_size=args.hidden_size, num_attention_heads=4,
                     ffn_hidden_size=4 * args.hidden_size, max_position_embeddings=SEQ, padded_vocab_size=VOCAB)
    with torch.device("meta"):
        return sum(p.numel() for p in GPT(shape).parameters())


def print_table(rows: list[dict], n: int, psi: int) -> None:
    """Bytes per parameter between steps and at the peak in a step, each over the paper's formula."""
    print(f"Ψ = {psi} parameters, N = {n} ranks")
    print("| precision | run | paper bytes/Ψ | between steps bytes/Ψ | / paper | peak in step bytes/Ψ | / paper | "
          "peak at | optimizer on device (MB) | process peak (MB) | step ms | vs stage 0 |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        base = next(r for r in rows if r["precision"] == row["precision"] and r["stage"] == 0)
        paper = paper_formula(row["stage"], n)
        between, peak = row["model_state_bytes"] / psi, row["peak_state_bytes"] / psi
        print(f"| {row['precision']} | {row['run']} | {paper:.2f} | {between:.2f} | {between / paper:.2f} | "
              f"{peak:.2f} | {peak / paper:.2f} | {row['peak_point']} | {row['optimizer_device_bytes'] / 1e6:.2f} | "
              f"{row['peak_bytes'] / 1e6:.0f} | {row['step_ms']:.1f} | {row['step_ms'] / base['step_ms']:.2f} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--hidden-size", type=int, default=128)
    parser.add_argument("--num-layers", type=int, default=4)
    parser.add_argument("--steps", type=int, default=4,
                        help="steps per run (at least 2: the peak in a step is taken after the first)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="cuda: one GPU per rank (peak = max_memory_allocated)")
    parser.add_argument("--json", help="also write the rows here")
    args = parser.parse_args(argv)
    if args.steps < MIN_STEPS:
        parser.error(f"--steps must be at least {MIN_STEPS}: the peak within a step is taken after the first step")
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
