"""``predict`` and ``finetune`` fit their windows to the model they load (issue 27, point 13).

Promised: ``predict --load CKPT --input "..."`` with its defaults on a fine-tuned model of fewer than 384
positions takes ``--max-seq-length`` (and a fitting ``--doc-stride`` and ``--max-query-length``) from the
model and answers; a ``--max-seq-length`` past the model's positions is refused in one line naming the
flag and the model's positions (it ended in ``IndexError: index out of range in self``); ``finetune --load``
with defaults fits the same way.
"""

from __future__ import annotations

import pytest

from trainer.models.bert.squad.finetune_cli import main as finetune
from trainer.models.bert.squad.predict_cli import main as predict

POSITIONS = 40
QUESTION = "Berlin is the capital of Germany. - What is the capital of Germany?"


@pytest.fixture(scope="module")
def fine_tuned(data_test, tmp_path_factory):
    """A 1-layer QA model fine-tuned with 40-token windows (so it has 40 positions)."""
    ckpt = tmp_path_factory.mktemp("squad") / "ckpt"
    sample = str(data_test / "squad" / "squad_sample.json")
    assert finetune(["--task", "squad", "--train-file", sample, "--vocab-file",
                     str(data_test / "tokenizers" / "wordpiece-vocab.txt"), "--save", str(ckpt), "--epochs", "1",
                     "--micro-batch-size", "8", "--num-layers", "1", "--hidden-size", "32", "--ffn-hidden-size", "64",
                     "--max-seq-length", str(POSITIONS), "--doc-stride", "8", "--max-query-length", "16",
                     "--device", "cpu"]) == 0
    return ckpt


def test_predict_with_defaults_fits_the_model(fine_tuned, capsys):
    assert predict(["--load", str(fine_tuned), "--input", QUESTION, "--device", "cpu"]) == 0
    out, err = capsys.readouterr()
    assert "Traceback" not in err and eval(out.strip())[0]["text"]


def test_predict_refuses_a_window_past_the_models_positions(fine_tuned, capsys):
    assert predict(["--load", str(fine_tuned), "--input", QUESTION, "--max-seq-length", "64", "--device", "cpu"]) != 0
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [f"predict: error: --max-seq-length 64 is past the model's {POSITIONS} positions"]


def test_finetune_evaluates_a_loaded_model_with_defaults(fine_tuned, data_test, tmp_path, capsys):
    sample = str(data_test / "squad" / "squad_sample.json")
    assert finetune(["--task", "squad", "--valid-file", sample, "--load", str(fine_tuned), "--output-dir",
                     str(tmp_path / "eval"), "--device", "cpu"]) == 0
    assert "exact_match" in capsys.readouterr().out
