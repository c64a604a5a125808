"""Training and evaluation metrics: the Megatron-style log line, a JSON-lines file, TensorBoard, FLOPs.

Only rank 0 writes. TFLOP/s count model FLOPs (forward + backward = 3 x forward matmul FLOPs; the
recomputation of activation checkpointing is not counted), per device; MFU divides them by the
device's dense peak when it is known (bf16/fp16 on the GPUs in `PEAK_FLOPS`).
"""

from __future__ import annotations

import json
import logging
import math
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from trainer.model import GPTShape
from trainer.t5_model import T5Shape

logger = logging.getLogger(__name__)

# Dense bf16/fp16 tensor-core peaks in FLOP/s (vendor datasheets, SXM parts).
PEAK_FLOPS = {"H200": 989.4e12, "H100": 989.4e12, "A100": 312e12, "A800": 312e12, "H800": 989.4e12}
# forward + backward: the backward pass costs two forward passes.
FORWARD_BACKWARD_FACTOR = 3
# A gated MLP (T5 v1.1) projects its input twice: the gate and the value.
GATED_INPUTS = 2
# Megatron caps the loss at 20 before exponentiating: larger perplexities carry no information.
PERPLEXITY_LOSS_CAP = 20.0


def model_flops_per_token(shape: GPTShape, seq_length: int) -> float:
    """Training FLOPs per token: 3 x (q/k/v/o + MLP + attention-score matmuls + output head), 2 FLOPs per MAC."""
    h, ffn = shape.hidden_size, shape.ffn_hidden_size
    per_layer = 2 * (4 * h * h + 2 * h * ffn) + 2 * 2 * seq_length * h
    return FORWARD_BACKWARD_FACTOR * (shape.num_layers * per_layer + 2 * h * shape.padded_vocab_size)


def t5_flops_per_token(shape: T5Shape, encoder_length: int, decoder_length: int) -> float:
    """Training FLOPs per sample position (encoder + decoder), counted as `model_flops_per_token`.

    Per sample: encoder blocks (q/k/v/o, MLP, scores over ``encoder_length``) on every encoder
    position; decoder blocks (self-attention, MLP, cross-attention q/o and scores) on every decoder
    position, plus the cross-attention k/v projections of every encoder position; the LM head on
    every decoder position. Gated-GELU MLPs have two input projections.
    """
    d, inner, d_ff = shape.d_model, shape.num_heads * shape.d_kv, shape.d_ff
    mlp = 2 * (GATED_INPUTS if shape.feed_forward == "gated-gelu" else 1) * d * d_ff + 2 * d_ff * d
    projections = 2 * 4 * d * inner
    encoder = shape.num_encoder_layers * encoder_length * (projections + mlp + 2 * 2 * encoder_length * inner)
    decoder_position = (projections + 2 * 2 * decoder_length * inner  # self-attention
                        + 2 * 2 * d * inner + 2 * 2 * encoder_length * inner  # cross-attention q, o and scores
                        + mlp)
    cross_kv = 2 * 2 * d * inner * encoder_length
    decoder = shape.num_decoder_layers * (decoder_length * decoder_position + cross_kv)
    head = 2 * d * shape.vocab_size * decoder_length
    return FORWARD_BACKWARD_FACTOR * (encoder + decoder + head) / (encoder_length + decoder_length)


def device_peak_flops(device: torch.device, low_precision: bool) -> float | None:
    """The device's dense bf16/fp16 peak, or None when unknown (CPUs, fp32, unlisted GPUs)."""
    if device.type != "cuda" or not low_precision:
        return None
    name = torch.cuda.get_device_name(device)
    return next((peak for key, peak in PEAK_FLOPS.items() if key in name), None)


@dataclass(slots=True)
class TrainStats:
    """Averages over one log interval."""

    iteration: int
    train_iters: int
    consumed_samples: int
    global_batch_size: int
    lr: float
    loss: float
    grad_norm: float
    loss_scale: float
    skipped_iterations: int
    ms_per_iteration: float
    data_ms_per_iteration: float
    tokens_per_second: float
    tflops_per_device: float
    mfu: float | None

    def log_line(self) -> str:
        line = (f" iteration {self.iteration:8d}/{self.train_iters:8d} | consumed samples: {self.consumed_samples:12d}"
                f" | elapsed time per iteration (ms): {self.ms_per_iteration:.1f}"
                f" | learning rate: {self.lr:.6E} | global batch size: {self.global_batch_size:5d}"
                f" | lm loss: {self.loss:.6E} | loss scale: {self.loss_scale:.1f} | grad norm: {self.grad_norm:.3f}"
                f" | number of skipped iterations: {self.skipped_iterations:3d}"
                f" | tokens/s: {self.tokens_per_second:.0f} | TFLOP/s/device: {self.tflops_per_device:.3f}")
        if self.mfu is not None:
            line += f" | MFU: {100 * self.mfu:.1f}%"
        return line


def _drop_records_after(path: Path, iteration: int) -> None:
    """Rewrite the JSON-lines file ``path`` (if it exists) without its records of later iterations."""
    if not path.is_file() or path.stat().st_size == 0:
        return
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    kept = [line for line in lines if _record_iteration(line) <= iteration]
    if len(kept) == len(lines):
        return
    temp = path.with_name(path.name + ".tmp")
    temp.write_text("".join(kept), encoding="utf-8")
    os.replace(temp, path)
    logger.info("%s: dropped %d records after iteration %d (redone by this run)", path, len(lines) - len(kept),
                iteration)


def _record_iteration(line: str) -> int:
    """The ``iteration`` of one JSON-lines record; a line that is not one is kept (-1)."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError:
        return -1
    value = record.get("iteration") if isinstance(record, dict) else None
    return value if isinstance(value, int) else -1


class MetricsWriter:
    """Writes log lines, JSON lines and TensorBoard scalars on rank 0; does nothing elsewhere.

    The JSON-lines file (none when ``metrics_file`` is None) continues the run's history: records of
    iterations after ``start_iteration`` (the resumed checkpoint's; 0 from scratch), which the run is
    about to redo, are dropped, so a resumed run never repeats a line.
    """

    def __init__(self, metrics_file: str | os.PathLike | None, tensorboard_dir: str | None, is_rank0: bool,
                 start_iteration: int = 0) -> None:
        self.enabled = is_rank0
        self._file = None
        self._tensorboard = None
        if not self.enabled:
            return
        if metrics_file is not None:
            path = Path(metrics_file)
            path.parent.mkdir(parents=True, exist_ok=True)
            _drop_records_after(path, start_iteration)
            self._file = path.open("a", encoding="utf-8")
        if tensorboard_dir is not None:
            from torch.utils.tensorboard import SummaryWriter  # imported only when asked: optional package

            self._tensorboard = SummaryWriter(tensorboard_dir)

    def _write(self, record: dict) -> None:
        if self._file is not None:
            self._file.write(json.dumps(record) + "\n")
            self._file.flush()

    def train(self, stats: TrainStats) -> None:
        if not self.enabled:
            return
        logger.info(stats.log_line())
        record = {name: getattr(stats, name) for name in stats.__slots__ if name != "train_iters"}
        self._write(record)
        if self._tensorboard is not None:
            for name in ("loss", "lr", "grad_norm", "loss_scale", "tokens_per_second", "ms_per_iteration"):
                self._tensorboard.add_scalar(f"train/{name}", getattr(stats, name), stats.iteration)

    def evaluation(self, iteration: int, split: str, loss: float) -> None:
        if not self.enabled:
            return
        perplexity = math.exp(min(loss, PERPLEXITY_LOSS_CAP))
        logger.info(" %s loss at iteration %d | lm loss value: %.6E | lm loss PPL: %.6E", split, iteration, loss,
                    perplexity)
        self._write({"iteration": iteration, "split": split, "loss": loss, "perplexity": perplexity})
        if self._tensorboard is not None:
            self._tensorboard.add_scalar(f"{split}/loss", loss, iteration)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
        if self._tensorboard is not None:
            self._tensorboard.close()
