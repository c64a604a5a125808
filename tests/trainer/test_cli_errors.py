"""Bad configurations fail fast: one line on stderr naming the flags, a non-zero exit, never a hang.

Layout rules are checked before any worker starts; a wrong checkpoint is found by the workers
themselves, which must still exit cleanly.
"""

import importlib.util

import pytest
from trainer_testing import argv_for, result_record, tiny_config

from trainer.cli.train import main


def run_failing(argv, capsys) -> str:
    assert main(argv) != 0
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("train: error: ")
    return lines[0]


@pytest.fixture()
def tiny_argv(tiny_prefix, cache_dir):
    return argv_for(tiny_config(tiny_prefix, cache_dir))


@pytest.mark.parametrize(("extra", "expected"), [
    (["--tensor-model-parallel-size", "3", "--nproc-per-node", "3"],
     "--num-attention-heads (4) is not divisible by --tensor-model-parallel-size (3)"),
    (["--pipeline-model-parallel-size", "2", "--num-layers", "3", "--nproc-per-node", "2"],
     "--num-layers (3) is not divisible by --pipeline-model-parallel-size (2)"),
    (["--global-batch-size", "6", "--micro-batch-size", "4", "--nproc-per-node", "2"],
     "--global-batch-size (6) is not divisible by --micro-batch-size (4) x data-parallel size (2)"),
    (["--num-accumulation-steps", "3"],
     "--num-accumulation-steps (3) disagrees with --global-batch-size (8)"),
    (["--tensor-model-parallel-size", "2", "--nproc-per-node", "3"],
     "world size 3 (--num-gpus-per-node x --num-nodes) is not divisible by --tensor-model-parallel-size (2)"),
    (["--sequence-parallel", "--tensor-model-parallel-size", "2", "--seq-length", "31",
      "--max-position-embeddings", "32", "--nproc-per-node", "2"],
     "--seq-length (31) is not divisible by --tensor-model-parallel-size (2)"),
    (["--pipeline-model-parallel-size", "2", "--global-batch-size", "6", "--micro-batch-size", "2",
      "--nproc-per-node", "2"], "is not divisible by --pipeline-model-parallel-size (2)"),
    (["--hidden-size", "30"], "--hidden-size (30) is not divisible by --num-attention-heads (4)"),
])
def test_layout_errors_name_the_flags(tiny_argv, extra, expected, capsys):
    assert expected in run_failing(tiny_argv + extra, capsys)


@pytest.mark.parametrize("nproc", ["1", "2"])
def test_missing_dataset_fails_before_training(tiny_argv, nproc, tmp_path, capsys):
    argv = tiny_argv + ["--dataset", str(tmp_path / "absent"), "--nproc-per-node", nproc]
    assert "absent.bin not found" in run_failing(argv, capsys)


def test_an_unwritable_save_path_is_one_line_naming_it(tiny_argv, tmp_path, capsys):
    (tmp_path / "a_file").write_text("")
    assert main(tiny_argv + ["--train-iters", "1", "--save", str(tmp_path / "a_file" / "run")]) != 0
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1] == f"train: error: [Errno 20] Not a directory: '{tmp_path / 'a_file' / 'run'}'"


def test_unknown_vocabulary_size_is_reported(tiny_prefix, cache_dir, capsys):
    argv = [a for a in argv_for(tiny_config(tiny_prefix, cache_dir)) if a not in ("--vocab-size", "256")]
    assert "vocabulary size is unknown" in run_failing(argv, capsys)


@pytest.fixture(scope="module")
def small_checkpoint(tiny_prefix, cache_dir, tmp_path_factory) -> str:
    directory = tmp_path_factory.mktemp("hidden32_checkpoint")
    result_record(tiny_config(tiny_prefix, cache_dir, train_iters=1, save=str(directory)))
    return str(directory)


def test_checkpoint_of_another_model_shape_is_refused(small_checkpoint, tiny_prefix, cache_dir, capsys):
    argv = argv_for(tiny_config(tiny_prefix, cache_dir, hidden_size=64, load=small_checkpoint))
    message = run_failing(argv, capsys)
    assert "model.tok_embeddings.weight of shape (256, 32) but the model's is (256, 64)" in message


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_workers_report_a_wrong_checkpoint_and_exit(small_checkpoint, tiny_prefix, cache_dir, capfd):
    config = tiny_config(tiny_prefix, cache_dir, num_layers=2, tp=2, load=small_checkpoint)
    assert main(argv_for(config) + ["--nproc-per-node", "2", "--master-port", "0"]) != 0
    errors = [line for line in capfd.readouterr().err.splitlines() if line.startswith("train: error: ")]
    assert len(errors) == 1
    assert "holds model.layers.2.attention.wk.bias, which this model lacks" in errors[0]


@pytest.mark.skipif(importlib.util.find_spec("tensorboard") is not None, reason="tensorboard is installed")
def test_tensorboard_dir_without_tensorboard_is_a_clear_error(tiny_argv, tmp_path, capsys):
    message = run_failing(tiny_argv + ["--tensorboard-dir", str(tmp_path)], capsys)
    assert "--tensorboard-dir needs the tensorboard package" in message
