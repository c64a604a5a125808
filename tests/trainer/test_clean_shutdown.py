"""A multi-process run that succeeds prints nothing alarming: no C++ stack trace, no "Error waiting on exit
barrier" from a node whose workers all finished, no warning about unwaited collectives or sequential
all-reduces (issue: node 1 of a 2-node run printed a TCPStore stack trace although it succeeded).

Each test runs the `train` command as its users do, in separate processes (two "nodes" on this machine,
or one node with two workers), and reads their stderr whole.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from process_testing import free_port

ALARMS = ("Error waiting on exit barrier", "frame #", "Traceback", "unwaited collective", "sequential all_reduce",
          "Warning", "WARNING")
RUN_TIMEOUT_S = 300


def _argv(prefix: str, cache: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "trainer.cli.train", "--dataset", prefix, "--vocab-size", "256",
            "--make-vocab-size-divisible-by", "64", "--data-cache-path", cache, "--num-layers", "2",
            "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "32", "--micro-batch-size", "2",
            "--global-batch-size", "4", "--train-iters", "3", "--log-interval", "1", "--eval-iters", "0", "--device", "cpu",
            *extra]


def _alarms(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if any(alarm in line for alarm in ALARMS)]


@pytest.mark.timeout(RUN_TIMEOUT_S + 60)
def test_two_nodes_that_succeed_leave_quietly(tiny_prefix, tmp_path):
    port = str(free_port())
    env = {key: value for key, value in os.environ.items() if key not in ("NNODES", "NODE_RANK", "MASTER_PORT")}
    launch = ["--num-nodes", "2", "--num-gpus-per-node", "1", "--master-addr", "127.0.0.1", "--master-port", port]
    nodes = [subprocess.Popen(_argv(tiny_prefix, str(tmp_path / "cache"), *launch, "--node-rank", rank),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
             for rank in ("1", "0")]
    outputs = [node.communicate(timeout=RUN_TIMEOUT_S) for node in nodes]
    for node, (_, stderr) in zip(nodes, outputs):
        assert node.returncode == 0, stderr
        assert not _alarms(stderr), stderr


@pytest.mark.timeout(RUN_TIMEOUT_S + 60)
# Pipeline and ZeRO runs (12 s each) under the campaign: the two-node and the four-way T5 cases leave quietly too.
@pytest.mark.parametrize("layout", [
    pytest.param(["--tensor-model-parallel-size", "2", "--sequence-parallel"], id="tp2-sp"),
    pytest.param(["--pipeline-model-parallel-size", "2"], id="pp2", marks=pytest.mark.campaign),
    pytest.param(["--use-distributed-optimizer"], id="dp2-fsdp", marks=pytest.mark.campaign)])
def test_two_workers_that_succeed_leave_quietly(tiny_prefix, tmp_path, layout):
    argv = _argv(tiny_prefix, str(tmp_path / "cache"), "--nproc-per-node", "2", "--master-port", str(free_port()),
                 *layout)
    run = subprocess.run(argv, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert not _alarms(run.stderr), run.stderr


@pytest.mark.slow
@pytest.mark.timeout(RUN_TIMEOUT_S + 60)
def test_a_t5_split_four_ways_with_evaluation_leaves_quietly(sentence_prefix, data_test, tmp_path):
    """PP 2 x TP 2 with sequence parallelism and an evaluation: the decoder embeddings only pass through the
    encoder stage, and their reduce-scatter was left unwaited (`trainer.parallel.pipeline.settled`)."""
    argv = [sys.executable, "-m", "trainer.cli.train", "--model", "t5", "--dataset", sentence_prefix,
            "--tokenizer-type", "SentencePieceTokenizer",
            "--tokenizer-model", str(data_test / "tokenizers" / "sp-unigram.model"), "--split", "90,5,5",
            "--data-cache-path", str(tmp_path / "cache"), "--num-layers", "2", "--hidden-size", "32",
            "--num-attention-heads", "4", "--ffn-hidden-size", "64", "--encoder-seq-length", "32",
            "--decoder-seq-length", "16", "--micro-batch-size", "2", "--global-batch-size", "4",
            "--train-iters", "2", "--eval-interval", "2", "--eval-iters", "1", "--device", "cpu",
            "--nproc-per-node", "4", "--master-port", str(free_port()), "--tensor-model-parallel-size", "2",
            "--pipeline-model-parallel-size", "2", "--sequence-parallel"]
    run = subprocess.run(argv, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert not _alarms(run.stderr), run.stderr

