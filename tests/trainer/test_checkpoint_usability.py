"""Checkpoints come back the way users expect:

- ``train --load`` of a ``convert-checkpoint --from-hf`` checkpoint takes the model shape and the
  tokenizer from it (as ``--load-hf`` does), and a flag that contradicts it is one line;
- ``--load`` of a path that does not exist is an error (a typo never trains from scratch); an empty
  directory starts from scratch, said once, and so does ``--load P --save P`` before P exists;
- ``metrics.jsonl`` is written only beside ``--save`` (or to ``--metrics-file``), and a resumed run
  drops the records of the iterations it redoes instead of repeating them;
- exported files get the permissions of a plain ``open()`` (0644 under umask 022), not 0600.
"""

import json
import os
import stat

import pytest
from hf_testing import make_tiny_hf
from trainer_testing import argv_for, tiny_config

from trainer.checkpoint.store import LATEST_FILE
from trainer.cli.train import main as train_main
from trainer.cli.convert import main as convert_main
from trainer.models.gpt.convert import checkpoint_model

GPT2_VOCAB = 50257
STEPS = 2


def data_argv(tiny_prefix: str, cache_dir: str) -> list[str]:
    """Data, batch and length flags only: no model shape, no tokenizer."""
    return ["--dataset", tiny_prefix, "--data-cache-path", cache_dir, "--split", "98,1,1", "--seq-length", "32",
            "--micro-batch-size", "2", "--global-batch-size", "8", "--train-iters", str(STEPS), "--eval-iters", "0",
            "--device", "cpu"]


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """A `convert-checkpoint --from-hf` checkpoint of a tiny GPT-2 with GPT-2's tokenizer files."""
    root = tmp_path_factory.mktemp("converted")
    hf_dir = make_tiny_hf(root / "hf", vocab_size=GPT2_VOCAB, with_gpt2_tokenizer=True)
    assert convert_main(["--from-hf", str(hf_dir), "--to", str(root / "checkpoint")]) == 0
    return root / "checkpoint"


def test_load_takes_the_shape_and_tokenizer_of_a_converted_checkpoint(converted, tiny_prefix, cache_dir, tmp_path):
    assert train_main([*data_argv(tiny_prefix, cache_dir), "--load", str(converted),
                       "--save", str(tmp_path / "run")]) == 0
    _, iteration, info = checkpoint_model(tmp_path / "run")
    assert (iteration, info.vocab_size, info.shape.hidden_size, info.shape.num_layers) == (STEPS, GPT2_VOCAB, 64, 2)


def test_a_flag_that_contradicts_the_checkpoint_is_one_line(converted, tiny_prefix, cache_dir, capsys):
    assert train_main([*data_argv(tiny_prefix, cache_dir), "--load", str(converted), "--hidden-size", "32"]) != 0
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("train: error: ") and "shape" in lines[0], lines


def test_a_load_path_that_does_not_exist_is_an_error(tiny_prefix, cache_dir, tmp_path, capsys):
    argv = argv_for(tiny_config(tiny_prefix, cache_dir, train_iters=1))
    assert train_main([*argv, "--load", str(tmp_path / "typo")]) != 0
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == [f"train: error: the checkpoint to load, {tmp_path / 'typo'}, does not exist: give a "
                     "checkpoint root, or an empty directory to start from scratch"]


def test_load_and_save_of_one_path_that_is_not_there_yet_starts_from_scratch(tiny_prefix, cache_dir, tmp_path):
    """Megatron's and OneFlow's resume-or-start idiom: the same path twice is no typo."""
    argv = argv_for(tiny_config(tiny_prefix, cache_dir, train_iters=1))
    run = str(tmp_path / "run")
    assert train_main([*argv, "--load", run, "--save", run]) == 0
    assert train_main([*argv, "--load", run, "--save", run, "--train-iters", "2"]) == 0
    assert (tmp_path / "run" / LATEST_FILE).read_text().strip() == "2"


def test_an_empty_load_directory_starts_from_scratch_said_once(tiny_prefix, cache_dir, tmp_path, caplog):
    (tmp_path / "empty").mkdir()
    argv = argv_for(tiny_config(tiny_prefix, cache_dir, train_iters=1))
    assert train_main([*argv, "--load", str(tmp_path / "empty")]) == 0
    assert caplog.text.count("training from scratch") == 1


def test_no_metrics_file_without_save(tiny_prefix, cache_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = tiny_config(tiny_prefix, cache_dir, train_iters=1)
    argv = [a for a in argv_for(config) if a not in ("--metrics-file", config.logging.metrics_file)]
    assert train_main(argv) == 0
    assert os.listdir(tmp_path) == []


def test_a_resumed_run_drops_the_metrics_it_redoes(tiny_prefix, cache_dir, tmp_path):
    save, metrics = tmp_path / "run", tmp_path / "metrics.jsonl"
    run = tiny_config(tiny_prefix, cache_dir, train_iters=6, save=str(save), save_interval=3,
                      metrics_file=str(metrics))
    assert train_main([*argv_for(run), "--log-interval", "1"]) == 0
    # As after a crash at step 5: the latest checkpoint is step 3, the file has lines up to 6.
    (save / LATEST_FILE).write_text("3\n")
    assert train_main([*argv_for(run), "--log-interval", "1", "--load", str(save)]) == 0
    iterations = [json.loads(line)["iteration"] for line in metrics.read_text().splitlines()]
    assert iterations == [1, 2, 3, 4, 5, 6]


def test_exported_files_get_the_usual_permissions(converted, tmp_path):
    umask = os.umask(0o022)
    try:
        assert convert_main(["--from", str(converted), "--to-hf", str(tmp_path / "out")]) == 0
    finally:
        os.umask(umask)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in (tmp_path / "out").iterdir()}
    assert modes and set(modes.values()) == {0o644}, modes
