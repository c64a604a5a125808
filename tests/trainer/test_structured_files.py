"""Every JSON, JSON-lines and YAML file a command reads is bounded in size and nesting depth (issues 26, 34).

``/dev/zero`` (an endless read), a FIFO without a writer (an endless wait), a directory, a file past the
size its kind may have (sparse: nothing is written), JSON or YAML nested 100,000 deep (Python's parsers
recurse once per level) and bytes that are not UTF-8 are each refused in one line naming the file, with a
non-zero exit and no traceback, under a short timeout: a hang fails fast. The readers: ``train --config``
(YAML), ``train --deepspeed-config``, a HF directory's config.json (``convert-checkpoint --from-hf``), a
checkpoint's model_config.json (``generate --load``), ``evaluate --task lambada --data``, ``finetune --task
squad --train-file`` and ``plot-metrics``.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from cli_testing import refused
from evaluate_testing import make_eval_model
from hf_testing import make_tiny_hf
from trainer_testing import argv_for, tiny_config

from indexed_dataset.structured_files import CONFIG_FILE_LIMIT_BYTES, DATA_FILE_LIMIT_BYTES, read_json_file
from trainer.checkpoint.store import MODEL_CONFIG_FILE
from trainer.cli.train import main as train_main
from trainer.cli.convert import main as convert_main
from trainer.cli.evaluate import main as evaluate_main
from trainer.cli.generate import main as generate_main
from trainer.cli.plot import main as plot_main
from trainer.models.bert.squad.finetune_cli import main as finetune_main

# Seconds a command may take to refuse a file (a FIFO read would wait forever; /dev/zero read forever).
REFUSAL_TIMEOUT_S = 60
DEPTH = 100_000


def _deep_json(path: Path) -> None:
    path.write_text("[" * DEPTH + "]" * DEPTH, encoding="utf-8")


def _deep_json_line(path: Path) -> None:
    path.write_text('{"text": "a b c"}\n' + "[" * DEPTH + "]" * DEPTH + "\n", encoding="utf-8")


def _deep_yaml(path: Path) -> None:
    path.write_text("[" * DEPTH + "]" * DEPTH, encoding="utf-8")


def _deep_block_yaml(path: Path) -> None:
    """Nested by indentation (2,000 levels: Python's recursion limit is 1,000)."""
    path.write_text("".join("  " * i + f"k{i}:\n" for i in range(2000)), encoding="utf-8")


def _not_utf8(path: Path) -> None:
    path.write_bytes(b'{"text": "caf\xe9"}\n')


def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _directory(path: Path) -> None:
    path.mkdir()


def _sparse(size: int) -> Callable[[Path], None]:
    def make(path: Path) -> None:
        with open(path, "wb") as file:
            file.truncate(size)
    return make


def _twice_yaml(path: Path) -> None:
    path.write_text("lr: 0.001\nseed: 3\nlr: 0.1\n")


def _dev_zero(path: Path) -> None:
    path.symlink_to("/dev/zero")


COMMON = {"/dev/zero": (_dev_zero, "not a regular file"), "a FIFO": (_fifo, "not a regular file"),
          "a directory": (_directory, "not a regular file"), "not UTF-8": (_not_utf8, "not UTF-8")}
CONFIG_CASES = {**COMMON, "nested 100,000 deep": (_deep_json, "nested deeper"),
                "past the config limit": (_sparse(CONFIG_FILE_LIMIT_BYTES + 1), "more than the")}
YAML_CASES = {**COMMON, "nested 100,000 deep": (_deep_yaml, "nested deeper"),
              "nested 2,000 deep by indentation": (_deep_block_yaml, "nested deeper"),
              "a key given twice": (_twice_yaml, "'lr' is given twice"),
              "past the config limit": (_sparse(CONFIG_FILE_LIMIT_BYTES + 1), "more than the")}
LINES_CASES = {**COMMON, "a line nested 100,000 deep": (_deep_json_line, "nested deeper"),
               "past the data limit": (_sparse(DATA_FILE_LIMIT_BYTES + 1), "more than the")}
SQUAD_CASES = {**COMMON, "nested 100,000 deep": (_deep_json, "nested deeper"),
               "past the data limit": (_sparse(DATA_FILE_LIMIT_BYTES + 1), "more than the")}


def refusal_line(prog: str, main, argv: list[str], capsys) -> str:
    """The one stderr line of a refused command (asserting non-zero exit, no traceback, one line)."""
    return refused(main, argv, capsys, prog)


@pytest.mark.timeout(REFUSAL_TIMEOUT_S)
@pytest.mark.parametrize("case", list(YAML_CASES))
def test_train_config_yaml(case, tmp_path, capsys):
    make, expected = YAML_CASES[case]
    path = tmp_path / "run.yaml"
    make(path)
    line = refusal_line("train", train_main, ["--config", str(path), "--dataset", "p", "--vocab-size", "256"], capsys)
    assert str(path) in line and expected in line, line


@pytest.mark.timeout(REFUSAL_TIMEOUT_S)
@pytest.mark.parametrize("case", list(CONFIG_CASES))
def test_train_deepspeed_config(case, tmp_path, capsys):
    make, expected = CONFIG_CASES[case]
    path = tmp_path / "ds.json"
    make(path)
    line = refusal_line("train", train_main, ["--deepspeed-config", str(path), "--dataset", "x"], capsys)
    assert str(path) in line and expected in line, line


@pytest.fixture(scope="module")
def tiny_hf(tmp_path_factory) -> Path:
    return make_tiny_hf(tmp_path_factory.mktemp("structured_hf") / "hf")


# A HF directory is recognised by a regular config.json, so a FIFO or /dev/zero there is "not a HF directory".
HF_CASES = {name: CONFIG_CASES[name] for name in ("not UTF-8", "nested 100,000 deep", "past the config limit")}


@pytest.mark.timeout(REFUSAL_TIMEOUT_S)
@pytest.mark.parametrize("case", list(HF_CASES))
def test_hf_config_json(case, tiny_hf, tmp_path, capsys):
    make, expected = HF_CASES[case]
    directory = tmp_path / "hf"
    shutil.copytree(tiny_hf, directory)
    (directory / "config.json").unlink()
    make(directory / "config.json")
    line = refusal_line("convert-checkpoint", convert_main,
                        ["--from-hf", str(directory), "--to", str(tmp_path / "checkpoint")], capsys)
    assert str(directory / "config.json") in line and expected in line, line
    assert not (tmp_path / "checkpoint").exists()


@pytest.fixture(scope="module")
def saved_run(tiny_prefix, cache_dir, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("structured_checkpoint") / "run"
    assert train_main(argv_for(tiny_config(tiny_prefix, cache_dir, train_iters=1, save=str(root),
                                           num_layers=2))) == 0
    return root


@pytest.mark.timeout(REFUSAL_TIMEOUT_S)
@pytest.mark.parametrize("case", list(CONFIG_CASES))
def test_checkpoint_model_config_json(case, saved_run, tmp_path, capsys):
    make, expected = CONFIG_CASES[case]
    root = tmp_path / "run"
    shutil.copytree(saved_run, root)
    (root / MODEL_CONFIG_FILE).unlink()
    make(root / MODEL_CONFIG_FILE)
    line = refusal_line("generate", generate_main,
                        ["--load", str(root), "--prompt-ids", "1 2 3", "--max-new-tokens", "2", "--greedy"], capsys)
    assert MODEL_CONFIG_FILE in line, line


@pytest.fixture(scope="module")
def eval_model(tmp_path_factory) -> Path:
    """A tiny GPT-2 with GPT-2's tokenizer files (LAMBADA needs the tokenizer)."""
    return make_eval_model(tmp_path_factory.mktemp("structured_eval") / "hf")


@pytest.mark.timeout(REFUSAL_TIMEOUT_S)
@pytest.mark.parametrize("case", list(LINES_CASES))
def test_lambada_lines(case, eval_model, tmp_path, capsys):
    make, expected = LINES_CASES[case]
    path = tmp_path / "lambada.jsonl"
    make(path)
    line = refusal_line("evaluate", evaluate_main,
                        ["--task", "lambada", "--data", str(path), "--load", str(eval_model)], capsys)
    assert str(path) in line and expected in line, line


@pytest.mark.timeout(REFUSAL_TIMEOUT_S)
@pytest.mark.parametrize("case", list(SQUAD_CASES))
def test_squad_training_file(case, data_test, tmp_path, capsys):
    make, expected = SQUAD_CASES[case]
    path = tmp_path / "train.json"
    make(path)
    line = refusal_line("finetune", finetune_main,
                        ["--task", "squad", "--train-file", str(path), "--vocab-file",
                         str(data_test / "tokenizers" / "wordpiece-vocab.txt"), "--device", "cpu"], capsys)
    assert str(path) in line and expected in line, line


# plot-metrics reads a regular file only (a FIFO or a device is "no such metrics file") and streams its lines.
METRICS_CASES = {name: LINES_CASES[name] for name in ("not UTF-8", "a line nested 100,000 deep")}


@pytest.mark.timeout(REFUSAL_TIMEOUT_S)
@pytest.mark.parametrize("case", list(METRICS_CASES))
def test_plot_metrics_lines(case, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    make, expected = METRICS_CASES[case]
    path = tmp_path / "metrics.jsonl"
    make(path)
    before = path.read_bytes()
    line = refusal_line("plot-metrics", plot_main, [str(path), "--out", str(tmp_path / "loss.png")], capsys)
    assert str(path) in line, line
    assert path.read_bytes() == before and not (tmp_path / "loss.png").exists()


def test_the_reader_reports_the_byte_offset_of_bad_utf8(tmp_path):
    path = tmp_path / "x.json"
    _not_utf8(path)
    with pytest.raises(ValueError, match=r"x.json: not UTF-8 text \(byte offset 13"):
        read_json_file(path)


def test_shallow_files_still_parse(tmp_path):
    path = tmp_path / "x.json"
    path.write_text(json.dumps({"data": [{"paragraphs": [{"qas": [{"answers": [{"text": "[{"}]}]}]}]}))
    assert read_json_file(path)["data"][0]["paragraphs"][0]["qas"][0]["answers"][0]["text"] == "[{"
