"""The command lines of the guides our users come from (`shared/seeds/`) run unchanged, at tiny scale.

Each guide's flags are typed as the guide types them; only sizes (layers, widths, steps, batch) shrink so
that a CPU runs them in seconds. Every spelling is an alias of our own flag (same destination), so the
guide's command line builds exactly the configuration our own spelling builds.
"""

import json

import pytest
from process_testing import free_port

from trainer.cli.train import main
from trainer.cli.train_args import build_parser, config_from_args, environment_defaults
from trainer.config import DEFAULT_DIST_TIMEOUT_S
from trainer.models.t5.settings import t5_settings

GPT2_VOCAB_ARGS = ["--vocab-size", "256", "--make-vocab-size-divisible-by", "64", "--device", "cpu"]


def parse(argv, environ=None):
    parser = build_parser()
    parser.set_defaults(**environment_defaults(environ or {}))
    return config_from_args(parser.parse_args(argv))


def losses(metrics_file):
    return [r["loss"] for r in map(json.loads, metrics_file.read_text().splitlines()) if "split" not in r]


@pytest.mark.timeout(300)
def test_oneflow_gpt_pretraining_command(tiny_prefix, cache_dir, tmp_path, monkeypatch):
    """OneFlow GPT's `python3 -m oneflow_gpt.training` flags (345M -> 2 layers of width 32, 500000 -> 2 steps),
    `--fp16` included (on a CPU it computes in fp32, see the README); `--load checkpoint --save checkpoint`
    on a first run starts from scratch."""
    monkeypatch.chdir(tmp_path)
    argv = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4",
            "--micro-batch-size", "2", "--global-batch-size", "4", "--num-gpus-per-node", "1",
            "--train-iters", "2", "--learning-rate", "0.00015", "--dataset", tiny_prefix,
            "--seq-length", "32", "--split", "949,50,1", "--min-lr", "1.0e-5", "--lr-decay-style", "cosine",
            "--lr-decay-iters", "4", "--lr-warmup-fraction", "0.01", "--weight-decay", "1e-2",
            "--optimizer", "adamw", "--clip-grad", "1.0", "--vocab-size", "256",
            "--load", "checkpoint", "--save", "checkpoint", "--save-interval", "1", "--log-interval", "1",
            "--checkpoint-activations", "--multihead-attention-fusion",
            "--initial-loss-scale", "4294967296", "--tensor-model-parallel-size", "1",
            "--pipeline-model-parallel-size", "1", "--fp16",
            # sizes aside: a small vocabulary pads to itself, a CPU, and no evaluation (at 949,50,1 the
            # bundled data's test share rounds to no document)
            "--make-vocab-size-divisible-by", "64", "--eval-iters", "0", "--device", "cpu",
            "--data-cache-path", cache_dir]
    assert main(argv) == 0
    assert len(losses(tmp_path / "checkpoint" / "metrics.jsonl")) == 2


def test_oneflow_vocab_spelling_is_the_vocab_file_flag(data_test):
    vocab = str(data_test / "gpt2" / "gpt2-vocab.json")
    assert parse(["--dataset", "p", "--vocab", vocab]) == parse(["--dataset", "p", "--vocab-file", vocab])


def test_oneflow_preprocessing_command(data_test, tmp_path, monkeypatch):
    from preprocess.cli import main as preprocess_data

    monkeypatch.chdir(tmp_path)
    argv = ["--input", str(data_test / "sample_en.jsonl"), "--output-prefix", "gpt_sample_dataset",
            "--vocab", str(data_test / "gpt2" / "gpt2-vocab.json"), "--dataset-impl", "mmap",
            "--tokenizer-type", "GPT2BPETokenizer", "--merge-file", str(data_test / "gpt2" / "gpt2-merges.txt"),
            "--append-eod"]
    assert preprocess_data(argv) == 0
    assert (tmp_path / "gpt_sample_dataset_text_document.idx").is_file()


# CPM-Pretrain's run_gpt2.sh / run_t5.sh flags, with the launch variables of its scripts.
CPM_FLAGS = ["--model-parallel-size", "1", "--pipe-parallel-size", "1", "--num-layers", "2", "--hidden-size", "32",
             "--num-attention-heads", "4", "--max-position-embeddings", "32", "--batch-size", "2", "--gas", "2",
             "--lr", "1.5e-4", "--lr-decay-style", "cosine", "--min-lr", "1.0e-5", "--weight-decay", "1e-2",
             "--clip-grad", "1.0", "--warmup", "0.01", "--train-iters", "2", "--eval-iters", "0"]
MEGATRON_FLAGS = ["--tensor-model-parallel-size", "1", "--pipeline-model-parallel-size", "1", "--num-layers", "2",
                  "--hidden-size", "32", "--num-attention-heads", "4", "--max-position-embeddings", "32",
                  "--micro-batch-size", "2", "--num-accumulation-steps", "2", "--lr", "1.5e-4",
                  "--lr-decay-style", "cosine", "--min-lr", "1.0e-5", "--weight-decay", "1e-2", "--clip-grad", "1.0",
                  "--lr-warmup-fraction", "0.01", "--train-iters", "2", "--eval-iters", "0"]
CPM_LAUNCH = {"GPUS_PER_NODE": "1", "MASTER_ADDR": "localhost", "MASTER_PORT": "8888", "NNODES": "1",
              "NODE_RANK": "0"}


def test_cpm_pretrain_spellings_are_megatron_flags():
    cpm = parse(["--dataset", "p", *CPM_FLAGS, "--seq-length", "32"], CPM_LAUNCH)
    assert cpm == parse(["--dataset", "p", *MEGATRON_FLAGS, "--seq-length", "32", "--master-addr", "localhost",
                         "--master-port", "8888"])
    assert (cpm.training.micro_batch_size, cpm.training.num_accumulation_steps) == (2, 2)
    assert cpm.optimizer.lr_warmup_fraction == 0.01
    t5_flags = ["--model", "t5", "--kv-hidden-size", "16", "--ff-hidden-size", "256", "--enc-seq-length", "1024",
                "--dec-seq-length", "384"]
    parsed = parse(["--dataset", "p", *t5_flags])
    t5 = t5_settings(parsed)
    assert (parsed.model.kv_channels, t5.encoder_seq_length, t5.decoder_seq_length) == (16, 1024, 384)
    assert parse(["--dataset", "p", *t5_flags]).model.ffn_hidden_size == 256
    # pp_size=0 is CPM-Pretrain's "no pipeline"
    assert parse(["--dataset", "p", "--pipe-parallel-size", "0"]).parallelism.pipeline_model_parallel_size == 1


@pytest.mark.timeout(300)
def test_cpm_pretrain_gpt2_command(tiny_prefix, cache_dir, tmp_path, monkeypatch):
    for name, value in CPM_LAUNCH.items():
        monkeypatch.setenv(name, value)
    metrics = tmp_path / "metrics.jsonl"
    argv = [*CPM_FLAGS, "--seq-length", "32", "--dataset", tiny_prefix, "--split", "98,1,1",
            "--data-cache-path", cache_dir, "--metrics-file", str(metrics), "--log-interval", "1", *GPT2_VOCAB_ARGS]
    assert main(argv) == 0
    assert len(losses(metrics)) == 2


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_cpm_pretrain_t5_command_on_two_processes(sentence_prefix, data_test, cache_dir, tmp_path, monkeypatch):
    """run_t5.sh's flags with model parallel 2 (GPUS_PER_NODE=2; pp_size=0, CPM's "no pipeline")."""
    monkeypatch.setenv("GPUS_PER_NODE", "2")
    monkeypatch.setenv("MASTER_PORT", "0")  # any free port: tests run side by side
    metrics = tmp_path / "metrics.jsonl"
    argv = ["--model-parallel-size", "2", "--pipe-parallel-size", "0", "--num-layers", "2", "--hidden-size", "32",
            "--kv-hidden-size", "8", "--ff-hidden-size", "64", "--num-attention-heads", "4",
            "--enc-seq-length", "32", "--dec-seq-length", "16", "--max-position-embeddings", "1024",
            "--batch-size", "2", "--gas", "2", "--lr", "1.5e-4", "--lr-decay-style", "cosine", "--min-lr", "1.0e-5",
            "--weight-decay", "1e-2", "--clip-grad", "1.0", "--warmup", "0.01",
            # sizes aside, and what run_t5.sh sets elsewhere: the data, the tokenizer, the run length
            "--model", "t5", "--dataset", sentence_prefix, "--split", "98,2,0", "--train-iters", "2",
            "--eval-iters", "0", "--tokenizer-type", "SentencePieceTokenizer",
            "--tokenizer-model", str(data_test / "tokenizers" / "sp-unigram.model"), "--vocab-extra-ids", "100",
            "--make-vocab-size-divisible-by", "64", "--device", "cpu", "--data-cache-path", cache_dir,
            "--metrics-file", str(metrics), "--log-interval", "1"]
    assert main(argv) == 0
    assert len(losses(metrics)) == 2


LIBAI_LAUNCH = {"NODE": "1", "NODE_RANK": "0", "ADDR": "192.168.30.21", "PORT": "12345"}


def test_libai_launch_variables_are_the_launch_defaults():
    launch = parse(["--dataset", "p", "--nproc-per-node", "8"], LIBAI_LAUNCH).launch
    assert (launch.num_nodes, launch.node_rank, launch.master_addr, launch.master_port) == (1, 0, "192.168.30.21",
                                                                                            12345)
    assert launch.num_gpus_per_node == 8
    # flags still win over the variables
    assert parse(["--dataset", "p", "--master-port", "999"], LIBAI_LAUNCH).launch.master_port == 999
    assert parse(["--dataset", "p"], {"NODE": "2", "NODE_RANK": "1"}).launch.node_rank == 1
    assert parse(["--dataset", "p"]).launch.dist_timeout == DEFAULT_DIST_TIMEOUT_S


@pytest.mark.timeout(300)
def test_libai_single_node_command(tiny_prefix, cache_dir, tmp_path, monkeypatch):
    """`NODE=1 NODE_RANK=0 ADDR=... PORT=... bash tools/train.sh ... 1` as `NODE=... train ... --nproc-per-node 1`."""
    for name, value in {**LIBAI_LAUNCH, "ADDR": "127.0.0.1", "PORT": str(free_port())}.items():
        monkeypatch.setenv(name, value)
    metrics = tmp_path / "metrics.jsonl"
    argv = ["--nproc-per-node", "1", "--dataset", tiny_prefix, "--num-layers", "2", "--hidden-size", "32",
            "--num-attention-heads", "4", "--seq-length", "32", "--micro-batch-size", "2", "--train-iters", "2",
            "--eval-iters", "0", "--split", "98,1,1", "--data-cache-path", cache_dir, "--metrics-file", str(metrics),
            "--log-interval", "1", *GPT2_VOCAB_ARGS]
    assert main(argv) == 0
    assert len(losses(metrics)) == 2


@pytest.mark.parametrize(("environ", "expected"), [
    ({"NNODES": "two"}, "the environment variable NNODES='two' is not a valid --num-nodes (int)"),
    ({"NNODES": "2", "NODE": "1"}, "the environment variables NNODES=2 and NODE=1 disagree (both set --num-nodes)"),
    ({"PORT": "70000"}, "--master-port must be in [0, 65535], got 70000"),
])
def test_bad_launch_variables_are_one_line(tiny_prefix, environ, expected, monkeypatch, capsys):
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    assert main(["--dataset", tiny_prefix, "--vocab-size", "256"]) != 0
    assert capsys.readouterr().err.strip().splitlines() == [f"train: error: {expected}"]


@pytest.mark.parametrize("node_rank", ["0", "1"])
def test_a_node_left_alone_says_whom_it_waits_for_and_gives_up(tiny_prefix, node_rank, monkeypatch, capsys, caplog):
    """Node 0 (or node 1) of a 2-node run started alone: one line naming the wait, one line when it gives up."""
    monkeypatch.setenv("NODE_RANK", node_rank)
    port = free_port()
    argv = ["--dataset", tiny_prefix, "--vocab-size", "256", "--device", "cpu", "--num-nodes", "2",
            "--master-port", str(port), "--dist-timeout", "1"]
    with caplog.at_level("INFO", logger="trainer.parallel.distributed"):
        assert main(argv) == 1
    awaited = "waiting for 1 more node" if node_rank == "0" else "waiting for node 0"
    assert f"{awaited} at 127.0.0.1:{port} (giving up after 1 s)" in caplog.text
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("train: error: "), lines
    assert "--dist-timeout" in lines[0] and f"127.0.0.1:{port}" in lines[0]
