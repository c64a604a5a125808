"""Shared pieces of the trainer tests: the tiny model/data config, and `train` runs in gloo processes
(`process_testing.run_jobs`; several configurations share one launch).

The module is imported by the spawned children too (multiprocessing passes ``sys.path`` on).
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import numpy as np

from indexed_dataset import IndexedDataset, IndexedDatasetWriter
from process_testing import run_jobs
from trainer.cli import train as train_cli
from trainer.cli.train_args import option_name
from trainer.config import (
    FAMILIES_FIELD,
    CheckpointConfig,
    DataConfig,
    LoggingConfig,
    ModelConfig,
    OptimizerConfig,
    ParallelismConfig,
    TrainConfig,
    TrainingConfig,
)
from trainer.models.t5.settings import T5Config
from trainer.train import train

# The tiny model of the parity tests: vocab 256 pads to 256 for tp 1 and 2 (multiple of 64 x tp = 128).
TINY_VOCAB = 256
TINY_DIVISIBLE_BY = 64
TINY_STEPS = 10
# The T5 runs (`t5_config`): steps, and the sentence-split sample data they read (conftest's sentence_prefix).
T5_STEPS = 10
# Relative tolerance of a parallel layout's losses against one process's, in fp32. Tensor parallelism splits
# every matmul's inner sum in two and adds the halves (an all-reduce), so each logit differs from the
# single-process one by a few ulps (fp32 eps = 1.2e-7, relative); the loss is a mean of log-softmax terms
# and after a few AdamW steps, which divide each update by sqrt(v) and so turn ulp-sized gradient
# differences of small gradients into lr-sized weight differences, the losses drift apart by a few 1e-6
# relative (measured: 2.3e-6 at TP 2 over 3 steps on the HF T5 fixture; 1.6e-5 on a larger-weighted one).
# A wrong shard or a missed reduction changes the loss by percents.
LOSS_RTOL = 2e-5


def write_tiny_dataset(golden_prefix: str, prefix: str) -> str:
    """The golden GPT-2 documents with every id folded into ``TINY_VOCAB`` (same document lengths)."""
    source = IndexedDataset(golden_prefix)
    lengths = source.sequence_lengths.astype(np.int64)
    counts = np.diff(source.document_indices)
    with IndexedDatasetWriter(prefix, np.uint16) as writer:
        writer.add_documents((source.tokens % TINY_VOCAB).astype(np.uint16), lengths, counts)
    return prefix


def tiny_config(prefix: str, cache: str, *, tp: int = 1, pp: int = 1, schedule: str = "1f1b",
                sequence_parallel: bool = False, distributed_optimizer: bool = False, virtual_layers: int | None = None,
                train_iters: int = TINY_STEPS, save: str | None = None, load: str | None = None,
                save_interval: int | None = None, num_layers: int = 4, hidden_size: int = 32,
                micro_batch_size: int = 2, eval_iters: int = 0, metrics_file: str | None = None) -> TrainConfig:
    """The parity-test run: 4 layers, hidden 32, seq 32, global batch 8, fp32, no dropout, 10 steps."""
    return TrainConfig(
        model=ModelConfig(num_layers=num_layers, hidden_size=hidden_size, num_attention_heads=4, seq_length=32,
                          vocab_size=TINY_VOCAB, make_vocab_size_divisible_by=TINY_DIVISIBLE_BY,
                          hidden_dropout=0.0, attention_dropout=0.0),
        data=DataConfig(dataset=[prefix], split="98,1,1", data_cache_path=cache),
        training=TrainingConfig(micro_batch_size=micro_batch_size, global_batch_size=8, train_iters=train_iters,
                                device="cpu"),
        optimizer=OptimizerConfig(lr=3e-3, min_lr=3e-4, lr_warmup_iters=2, lr_decay_iters=2 * TINY_STEPS,
                                  clip_grad=0.5),
        parallelism=ParallelismConfig(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
                                      pipeline_schedule=schedule, sequence_parallel=sequence_parallel,
                                      use_distributed_optimizer=distributed_optimizer,
                                      num_layers_per_virtual_pipeline_stage=virtual_layers),
        checkpoint=CheckpointConfig(save=save, load=load, save_interval=save_interval),
        logging=LoggingConfig(log_interval=5, eval_interval=1000, eval_iters=eval_iters,
                              metrics_file=metrics_file or os.devnull),
    )


def argv_for(config: TrainConfig) -> list[str]:
    """The ``train`` command line that builds ``config`` (every field that differs from its default)."""
    argv: list[str] = []
    sections = [getattr(config, f.name) for f in dataclasses.fields(TrainConfig) if f.name != FAMILIES_FIELD]
    for value_section in (*sections, *config.families.values()):
        default_section = type(value_section)()
        for f in dataclasses.fields(value_section):
            value, default = getattr(value_section, f.name), getattr(default_section, f.name)
            if value == default:
                continue
            name = option_name(f.name)
            if isinstance(value, bool):
                argv.append(name)
            elif isinstance(value, list):
                argv += [name, *map(str, value)]
            else:
                argv += [name, str(value)]
    return argv


def lr_after_steps(config: TrainConfig, taken: int) -> float:
    """The learning rate of the step that follows ``taken`` steps of ``config`` (an iteration-based run: any
    batch size gives the same rates)."""
    scheduler = config.optimizer.scheduler(config.training, global_batch_size=1)
    scheduler.step(taken)
    return scheduler.lr()


def result_record(config: TrainConfig) -> dict:
    """Run ``config`` and return its result as plain data."""
    return dataclasses.asdict(train(config))


def train_in_process(argv: list[str], capsys) -> tuple[int, list[str]]:
    """``train argv`` in this process as a user types it (`trainer.cli.train.main`): (exit code, stderr lines),
    after checking that no traceback was printed."""
    try:
        code = train_cli.main(argv)
    except SystemExit as exit_:
        code = exit_.code
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return code, err.strip().splitlines()


def run_in_processes(world_size: int, configs: list[TrainConfig], workdir: Path) -> list[dict]:
    """Run ``configs`` one after another in ``world_size`` gloo processes; rank 0's results.

    Raises:
        TimeoutError: the launch exceeded its time limit (processes are killed, never left hanging).
    """
    return run_jobs(world_size, [(result_record, (config,), {}) for config in configs], workdir)


def t5_config(prefix: str, data_test, cache: str, *, train_iters: int = T5_STEPS, save: str | None = None,
              load: str | None = None, **parallelism) -> TrainConfig:
    """A 2+2-layer T5 v1.0 (width 32), 32 encoder / 16 decoder positions, global batch 4, fp32, no dropout."""
    return TrainConfig(
        # (no attention_dropout: T5 has one dropout rate, hidden_dropout, and `train` refuses the other)
        model=ModelConfig(model="t5", num_layers=2, hidden_size=32, num_attention_heads=4, ffn_hidden_size=64,
                          make_vocab_size_divisible_by=64, hidden_dropout=0.0),
        data=DataConfig(dataset=[prefix], split="98,2,0", data_cache_path=cache,
                        tokenizer_type="SentencePieceTokenizer",
                        tokenizer_model=str(data_test / "tokenizers" / "sp-unigram.model")),
        training=TrainingConfig(micro_batch_size=2, global_batch_size=4, train_iters=train_iters, device="cpu"),
        optimizer=OptimizerConfig(lr=3e-3, min_lr=3e-4, lr_warmup_iters=2, lr_decay_iters=2 * T5_STEPS, clip_grad=0.5),
        parallelism=ParallelismConfig(**parallelism),
        checkpoint=CheckpointConfig(save=save, load=load),
        logging=LoggingConfig(log_interval=5, eval_iters=1, metrics_file=os.devnull),
        families={"t5": T5Config(encoder_seq_length=32, decoder_seq_length=16, vocab_extra_ids=100)},
    )
