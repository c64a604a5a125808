"""``train --config run.yaml``: keys are our flag names (with - or _), the command line overrides the file,
and a bad file is one line naming it and the key."""

import pytest

from trainer.cli.train import main
from trainer.cli.train_args import build_parser, config_from_args
from trainer.cli.config_file import argv_with_config_file


def parse(argv):
    parser = build_parser()
    return config_from_args(parser.parse_args(argv_with_config_file(argv, parser)))


def write(tmp_path, text):
    path = tmp_path / "run.yaml"
    path.write_text(text)
    return str(path)


def test_file_keys_are_flag_names_and_the_command_line_wins(tmp_path):
    path = write(tmp_path, "num-layers: 4\nhidden_size: 64\nnum-attention-heads: 4\nlearning-rate: 3.0e-4\nbf16: true\n"
                           "data-path: [0.3, a, 0.7, b]\nmin_lr: -0.0\nsequence-parallel: false\nvocab_size: null\n")
    config = parse(["--config", path, "--hidden-size", "128"])
    assert (config.model.num_layers, config.model.hidden_size) == (4, 128)
    assert config.optimizer.lr == 3e-4 and config.precision.bf16
    assert config.data.blend == (["a", "b"], [0.3, 0.7])
    assert not config.parallelism.sequence_parallel and config.model.vocab_size is None
    assert parse(["--config", path, "--data-path", "c"]).data.blend == (["c"], None)


def test_the_file_builds_the_config_its_flags_build(tmp_path):
    path = write(tmp_path, "dataset: p\nnum_layers: 2\ntensor-model-parallel-size: 2\nseed: 7\n")
    assert parse(["--config", path]) == parse(["--dataset", "p", "--num-layers", "2",
                                               "--tensor-model-parallel-size", "2", "--seed", "7"])


@pytest.mark.parametrize(("text", "expected"), [
    ("num_layer: 4\n", "unknown key 'num_layer' (did you mean num-layers?)"),
    ("num-layers: four\n", "num-layers: invalid int value 'four'"),
    ("bf16: 1\n", "bf16 is a switch: true or false, got 1"),
    ("lr-decay-style: square\n", "lr-decay-style: 'square' is not one of constant, linear, cosine"),
    ("- a\n- b\n", "expected a mapping of flag names to values, got a list"),
    ("num-layers: [2\n", "not valid YAML at line 2, column 1"),
    # a value the flag takes but the range refuses: checked in the file (the command line may override it)
    ("seed: -1\n", "seed: must be in [0, 4294967295], got -1"),
])
def test_a_bad_file_is_one_line_naming_it(tmp_path, text, expected, capsys):
    path = write(tmp_path, text)
    assert main(["--config", path, "--dataset", "p", "--vocab-size", "256"]) != 0
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"train: error: {path}: {expected}")


def test_a_missing_file_is_one_line(tmp_path, capsys):
    assert main(["--config", str(tmp_path / "absent.yaml"), "--dataset", "p"]) != 0
    assert capsys.readouterr().err.strip() == (f"train: error: {tmp_path / 'absent.yaml'}: cannot read the config "
                                               "file (No such file or directory)")
