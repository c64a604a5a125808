"""Rough edges a new user met, each as typed (issue 27, points 4, 8 and 14).

Promised:
- ``generate`` prints each prompt and its continuation apart (header lines), so a continuation that starts
  with newlines is still readable; ``--json`` is unchanged;
- a tokenizer missing its files is refused in one line naming every missing flag at once, in
  ``preprocess-data``, ``train`` and ``generate`` alike;
- the quickstart ends with what it made and what to try next, and the README says that a 10-step tiny
  run's loss barely moves.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from preprocess.cli import main as preprocess_data
from trainer.cli.generate import format_completion
from trainer.cli.generate import main as generate
from trainer.cli.train import main as train

REPO = Path(__file__).resolve().parents[1]


def test_generate_text_output_shows_prompt_and_continuation_apart():
    record = {"prompt": "Hello, my name is", "text": "\n\nBob", "ids": [198, 198, 18861]}
    assert format_completion(record, as_json=False, number=2).splitlines() == [
        "--- prompt 2 ---", "Hello, my name is", "--- continuation 2 ---", "", "", "Bob"]
    assert json.loads(format_completion(record, as_json=True)) == record
    ids = {"prompt": [1, 2], "text": None, "ids": [3]}
    assert format_completion(ids, as_json=False).splitlines() == ["--- prompt 1 ---", "1 2", "--- continuation 1 ---",
                                                                  "3"]


@pytest.mark.parametrize("prog, command, argv", [
    ("preprocess-data", preprocess_data, ["--input", str(REPO / "data_test" / "sample_en.jsonl"),
                                          "--output-prefix", "{tmp}/out",
                       "--tokenizer-type", "GPT2BPETokenizer"]),
    ("generate", generate, ["--load", "{tmp}", "--prompt", "hi", "--tokenizer-type", "GPT2BPETokenizer"]),
])
def test_a_tokenizer_without_its_files_names_every_missing_flag(prog, command, argv, tmp_path, capsys):
    code = command([word.replace("{tmp}", str(tmp_path)) for word in argv])
    err = capsys.readouterr().err
    assert code != 0 and "Traceback" not in err
    assert err.strip().splitlines() == [f"{prog}: error: GPT2BPETokenizer needs --vocab-file and --merge-file"]
    assert sorted(path.name for path in tmp_path.iterdir()) == []


def test_train_names_the_missing_tokenizer_flags_at_once(tmp_path, capsys):
    code = train(["--dataset", str(REPO / "data_test" / "megatron" / "sample_en_eod_text_document"),
                  "--tokenizer-type", "BertWordPieceCase", "--merge-file", "x", "--device", "cpu"])
    err = capsys.readouterr().err
    assert code != 0 and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert "--" in err and "_file" not in err


def test_quickstart_ends_with_what_was_made_and_what_next():
    script = (REPO / "data_test" / "quickstart.sh").read_text()
    summary = script[script.rindex("cat <<SUMMARY"):]
    for words in ("Made:", "generate --load $out/checkpoint", "plot-metrics $out/checkpoint", "README.md",
                  "barely move the loss"):
        assert words in summary
    assert "barely move the loss" in (REPO / "README.md").read_text()


def test_build_indices_says_requested_and_indexed_samples(tmp_path, caplog):
    """``build-indices --train-samples 1000`` indexes whole epochs: both numbers are said, and "1 epoch"."""
    from samplers.cli import main as build_indices

    caplog.set_level("INFO")
    prefix = REPO / "data_test" / "megatron" / "sample_en_eod_text_document"
    assert build_indices(["--data-path", str(prefix), "--seq-length", "64", "--split", "90,5,5",
                          "--train-samples", "1000", "--valid-samples", "1",
                          "--test-samples", "1", "--data-cache-path", str(tmp_path / "cache")]) == 0
    train_line = next(r.getMessage() for r in caplog.records if " train: sequences" in r.getMessage())
    assert "1 epoch," in train_line and "1000 samples requested" in train_line and "indexed (whole epochs)" in train_line
    summary = [r.getMessage() for r in caplog.records if r.getMessage().startswith("train: ")]
    assert len(summary) == 1 and summary[0].startswith("train: 1000 requested, ") and "(whole epochs)" in summary[0]


def test_inspect_index_plot_checks_the_name_first_and_says_it_wrote(tmp_path, capsys):
    """A wrong picture suffix is refused before any report is printed; a picture written is named."""
    from trainer.cli.inspect import main as inspect_index

    prefix = str(REPO / "data_test" / "megatron" / "sample_en_eod_text_document")
    assert inspect_index([prefix, "--plot", str(tmp_path / "out.jpg")]) != 0
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1 and "out.jpg" in err and "Traceback" not in err
    pytest.importorskip("matplotlib")
    assert inspect_index([prefix, "--plot", str(tmp_path / "out.png")]) == 0
    assert capsys.readouterr().err.strip().splitlines() == [f"wrote {tmp_path / 'out.png'}"]
    assert sorted(path.name for path in tmp_path.iterdir()) == ["out.png"]


@pytest.mark.parametrize("module", ["trainer.cli.evaluate", "trainer.cli.generate"])
def test_model_commands_list_no_preprocessing_flags(module):
    import importlib

    text = importlib.import_module(module).build_parser().format_help()
    assert "--do-chinese-wwm" not in text and "--tokenizer-bert-include-special-tokens" not in text
    assert "--tokenizer-type" in text


def test_convert_checkpoint_help_names_every_family_and_finetune_shows_defaults():
    from trainer.cli.convert import build_parser as convert_parser
    from trainer.models.bert.squad.finetune_cli import build_parser as finetune_parser

    text = " ".join(convert_parser().format_help().split())
    for family in ("GPT-2", "BERT", "T5", "mT5", "Switch"):
        assert family in text
    text = " ".join(finetune_parser().format_help().split())
    for flag, default in (("--epochs EPOCHS", "2.0"), ("--lr LR", "3e-05"),
                          ("--micro-batch-size MICRO_BATCH_SIZE", "12")):
        assert f"(default {default})" in text[text.index(flag, text.index("options:")):][:200], flag


def test_preprocess_logs_the_published_mindrecord_path_and_convert_logs_plain_lines(tmp_path):
    """Point 5: the MindRecord line names the file that exists afterwards, not the staging folder's; point 10:
    ``convert`` writes plain lines as the other data commands (no "INFO indexed_dataset.convert:")."""
    import subprocess
    import sys

    prefix = tmp_path / "out"
    result = subprocess.run([sys.executable, "-m", "preprocess.cli", "--input", str(REPO / "data_test/sample_en.jsonl"),
                             "--output-prefix", str(prefix), "--tokenizer-type", "GPT2BPETokenizer",
                             "--vocab-file", str(REPO / "data_test/gpt2/gpt2-vocab.json"),
                             "--merge-file", str(REPO / "data_test/gpt2/gpt2-merges.txt"), "--workers", "1",
                             "--output-format", "mmap", "mindrecord"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    [line] = [line for line in result.stderr.splitlines() if "MindRecord shard" in line]
    published = line.split(": ")[0]
    assert ".staging-" not in line and Path(published).is_file()
    result = subprocess.run([sys.executable, "-m", "preprocess.convert_cli", "--from", "mmap", "--to", "arrow",
                             f"{prefix}_text_document", str(tmp_path / "copy_arrow")],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stderr.splitlines()
    assert lines and not any(line.startswith(("INFO ", "WARNING ")) for line in lines)


def test_inspect_index_says_requested_and_indexed_samples(capsys):
    """``inspect-index ... --train-samples 100``: "1 epoch, 100 requested, 3960 indexed (whole epochs)"."""
    from trainer.cli.inspect import main as inspect_index

    prefix = str(REPO / "data_test" / "megatron" / "sample_en_eod_text_document")
    assert inspect_index([prefix, "--seq-length", "64", "--train-samples", "100", "--split", "90,5,5"]) == 0
    out = capsys.readouterr().out
    lines = {line.split()[0]: line for line in out.splitlines() if line.startswith(("train ", "valid "))}
    assert lines["train"].endswith("1 epoch, 100 requested, 3960 indexed (whole epochs)")
    assert lines["valid"].endswith("1 epoch, 134 samples")
