"""Megatron-LM's GPT-3 example (examples/gpt3/train_gpt3_175b_distributed.sh, HEAD of 2026-08) runs unchanged:
every flag of its pretrain_gpt.py command line, in its order and spelling; only sizes (model, batch, steps,
intervals, parallel degrees, the batch schedule's numbers) and paths are changed, so that one CPU process runs it.

The script gives both --global-batch-size and --step-batch-size-schedule, which Megatron's HEAD itself refuses;
we accept the pair (the global batch size sizes the evaluations and the iteration-based learning-rate lengths).
``--tensorboard-dir`` writes the run's scalars with the optional tensorboard package (installed by the test
extra); without the package the line is refused in one line saying so.
"""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from indexed_dataset import IndexedDataset, IndexedDatasetWriter
from trainer.cli.train import main

# Copies of the bundled GPT-2 documents in the data path: the script's 949,50,1 split gives the test split a
# thousandth of the documents, which must be at least one.
COPIES = 5


@pytest.fixture(scope="module")
def data_path(data_test, tmp_path_factory) -> str:
    """The bundled GPT-2 token file's 232 documents, COPIES times over."""
    source = IndexedDataset(str(data_test / "megatron" / "sample_en_eod_text_document"))
    prefix = str(tmp_path_factory.mktemp("gpt3_data") / "corpus_text_document")
    lengths = source.sequence_lengths.astype(np.int64)
    with IndexedDatasetWriter(prefix, np.uint16) as writer:
        for _ in range(COPIES):
            writer.add_documents(source.tokens.astype(np.uint16), lengths, np.diff(source.document_indices))
    return prefix


def gpt3_argv(data_test, data_path, checkpoint_path, tensorboard_logs_path, cache_dir) -> list[str]:
    vocab_file = str(data_test / "gpt2" / "gpt2-vocab.json")
    merge_file = str(data_test / "gpt2" / "gpt2-merges.txt")
    gpt_model_args = [
        "--num-layers", "2",                      # 96
        "--hidden-size", "16",                    # 12288
        "--num-attention-heads", "4",             # 96
        "--seq-length", "32",                     # 2048
        "--max-position-embeddings", "32",        # 2048
        "--attention-backend", "auto",
    ]
    training_args = [
        "--micro-batch-size", "1",
        "--global-batch-size", "6",               # 1536
        # "0:16 2.4B:320 4.8B:624 7.2B:928 9.6B:1232 12B:1536" (tokens: 2.4K tokens are 75 samples of 32)
        "--step-batch-size-schedule", "0:1 0.32K:2 0.64K:3 0.96K:4 1.28K:5 1.6K:6",
        "--train-iters", "24",                    # 500000
        "--weight-decay", "0.1",
        "--adam-beta1", "0.9",
        "--adam-beta2", "0.95",
        "--init-method-std", "0.006",
        "--clip-grad", "1.0",
        "--fp16",
        "--lr", "6.0e-5",
        "--lr-decay-style", "cosine",
        "--min-lr", "6.0e-6",
        "--lr-warmup-fraction", ".001",
        "--lr-decay-iters", "20",                 # 430000
    ]
    model_parallel_args = [
        "--tensor-model-parallel-size", "1",      # 8
        "--pipeline-model-parallel-size", "1",    # 16
    ]
    data_args = [
        "--data-path", data_path,
        "--vocab-file", vocab_file,
        "--merge-file", merge_file,
        "--split", "949,50,1",
    ]
    eval_and_logging_args = [
        "--log-interval", "4",                    # 100
        "--save-interval", "12",                  # 10000
        "--eval-interval", "12",                  # 1000
        "--save", str(checkpoint_path),
        "--load", str(checkpoint_path),
        "--eval-iters", "1",                      # 10
        "--tensorboard-dir", str(tensorboard_logs_path),
    ]
    # Sizes aside: a CPU, and the index caches in the test's cache directory.
    local = ["--device", "cpu", "--data-cache-path", cache_dir]
    return [*gpt_model_args, *training_args, *model_parallel_args, *data_args, *eval_and_logging_args, *local]


@pytest.mark.timeout(600)
def test_the_gpt3_example_runs_with_megatrons_batch_schedule(data_test, data_path, cache_dir, tmp_path, capsys):
    checkpoint_path = tmp_path / "checkpoints"
    tensorboard_path = tmp_path / "tensorboard"
    assert main(gpt3_argv(data_test, data_path, checkpoint_path, tensorboard_path, cache_dir)) == 0, \
        capsys.readouterr().err
    records = [json.loads(line) for line in (checkpoint_path / "metrics.jsonl").read_text().splitlines()]
    train = [record for record in records if "lr" in record]
    assert train[-1]["iteration"] == 24
    # The logged steps' batches (every 4th): thresholds at 10, 20, 30, 40, 50 consumed samples (0.32K tokens of 32
    # per sample, ...): step 12 starts at 12 samples (2), 16 at 20 (3), 20 at 32 (4), 24 at 50 (6).
    assert [record["global_batch_size"] for record in train] == [1, 1, 2, 3, 4, 6]
    assert any(record.get("split") == "valid" for record in records)
    # TensorBoard holds the same training losses, at the same iterations, as metrics.jsonl.
    events = EventAccumulator(str(tensorboard_path))
    events.Reload()
    steps = [event.step for event in events.Scalars("train/loss")]
    losses = [event.value for event in events.Scalars("train/loss")]
    assert steps == [record["iteration"] for record in train]
    # TensorBoard stores float32: equal to the file's float64 losses within float32's rounding.
    assert losses == pytest.approx([record["loss"] for record in train], rel=1e-6)


def test_its_tensorboard_dir_without_tensorboard_is_one_line(data_test, data_path, cache_dir, tmp_path, capsys,
                                                             monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "tensorboard" else real(name, *a))
    assert main(gpt3_argv(data_test, data_path, tmp_path / "checkpoints", tmp_path / "tensorboard", cache_dir)) != 0
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and "--tensorboard-dir needs the tensorboard package" in lines[0]
    assert not (tmp_path / "checkpoints").exists()
