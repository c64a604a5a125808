"""The ``train`` command: flags, metrics file, and launching its own worker processes."""

import dataclasses
import json

import pytest
from trainer_testing import argv_for, tiny_config

from trainer.cli.train import main
from trainer.cli.train_args import _field_docstrings, _sections, build_parser, config_from_args

TRAIN_KEYS = {"iteration", "consumed_samples", "loss", "lr", "grad_norm", "ms_per_iteration", "tokens_per_second"}


def parse(argv):
    return config_from_args(build_parser().parse_args(argv))


def test_flags_follow_megatron_and_oneflow_spellings():
    config = parse(["--dataset", "p", "--learning-rate", "0.5", "--nproc-per-node", "4", "--node-ips", "10.0.0.1,10.0.0.2",
                    "--bf16", "--lr-decay-style", "linear", "--tensor-model-parallel-size", "2"])
    assert config.optimizer.lr == 0.5
    assert config.launch.num_gpus_per_node == 4
    assert config.launch.master_addr == "10.0.0.1"
    assert config.precision.bf16 and not config.precision.fp16
    assert config.optimizer.lr_decay_style == "linear"
    assert config.parallelism.tensor_model_parallel_size == 2
    assert config.data.blend == (["p"], None)


def test_data_path_takes_megatron_blend_weights():
    assert parse(["--data-path", "0.3", "a", "0.7", "b"]).data.blend == (["a", "b"], [0.3, 0.7])
    assert parse(["--data-path", "a"]).data.blend == (["a"], None)


def test_help_text_comes_from_field_docstrings():
    assert "Peak learning rate." in build_parser().format_help()


def test_every_flag_of_every_section_has_its_field_docstring_as_help():
    parser = build_parser()
    helps = {action.dest: action.help for action in parser._actions}
    for _, section in _sections():
        for f in dataclasses.fields(section):
            first_words = " ".join(_field_docstrings(section)[f.name].split()[:4])
            assert first_words and helps[f.name].startswith(first_words), (section.__name__, f.name)


def test_argv_round_trips_to_the_same_config(tiny_prefix, cache_dir):
    config = tiny_config(tiny_prefix, cache_dir, tp=2, pp=2, sequence_parallel=True)
    assert parse(argv_for(config)) == config


def read_metrics(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.timeout(300)
def test_single_process_run_writes_metrics_beside_checkpoints(reference, tiny_prefix, cache_dir, tmp_path):
    config = tiny_config(tiny_prefix, cache_dir, save=str(tmp_path), eval_iters=1)
    argv = argv_for(config) + ["--log-interval", "1", "--eval-interval", "5"]
    argv = [a for a in argv if a not in ("--metrics-file", config.logging.metrics_file)]
    assert main(argv) == 0
    records = read_metrics(tmp_path / "metrics.jsonl")
    train_lines = [r for r in records if "split" not in r]
    assert [r["iteration"] for r in train_lines] == list(range(1, 11))
    assert all(TRAIN_KEYS <= set(r) for r in train_lines)
    assert [r["loss"] for r in train_lines] == pytest.approx(reference["losses"], abs=1e-6)
    evals = [(r["iteration"], r["split"]) for r in records if "split" in r]
    assert evals == [(5, "valid"), (10, "valid"), (10, "test")]


@pytest.mark.timeout(300)
def test_cli_launches_its_own_processes(reference, tiny_prefix, cache_dir, tmp_path):
    metrics = tmp_path / "m.jsonl"
    config = tiny_config(tiny_prefix, cache_dir, tp=2, metrics_file=str(metrics))
    argv = argv_for(config) + ["--nproc-per-node", "2", "--log-interval", "1", "--master-port", "0"]
    assert main(argv) == 0
    losses = [r["loss"] for r in read_metrics(metrics)]
    assert losses == pytest.approx(reference["losses"], abs=1e-4)
