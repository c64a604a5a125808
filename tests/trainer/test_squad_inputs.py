"""``finetune --task squad``, ``predict`` and ``evaluate --task lambada`` refuse inputs they cannot use honestly.

What is promised (issues 26 and 34), each as one line naming the file (and the JSON path or passage), a non-zero
exit, no traceback and no hang:

- A SQuAD training file with no training examples (``{"data": []}``, paragraphs without questions), a question
  without answers or with an empty answer, an empty question or context, or a duplicate id.
- SQuAD v2 (``is_impossible``, ``plausible_answers``, ``"version": "v2.0"``): never trained or scored as v1.1.
- ``finetune --load-hf`` of a directory that is not a BERT (a GPT-2's) says so.
- Flags that would be ignored or are not numbers: ``--lr-decay-style exponential``, ``--lr inf``, ``--epochs nan``,
  ``--seed -1``, ``predict --top-k 0``.
- A LAMBADA passage of one word (no context to predict it from), strict or not.
"""

from __future__ import annotations

import json

import pytest
from cli_testing import refused
from evaluate_testing import tiny_hf  # noqa: F401  (a fixture)
from hf_testing import make_tiny_hf

from trainer.cli.evaluate import main as evaluate_main
from trainer.models.bert.squad.finetune_cli import main as finetune_main
from trainer.models.bert.squad.predict_cli import main as predict_main

pytestmark = pytest.mark.timeout(120)

CONTEXT = "Berlin is the capital of Germany."


def qa(qid="q1", question="What is the capital of Germany?", answers=None, **extra) -> dict:
    if answers is None:
        answers = [{"text": "Berlin", "answer_start": 0}]
    return {"id": qid, "question": question, "answers": answers, **extra}


def squad(*qas, context=CONTEXT, **top) -> dict:
    return {"version": "1.1", **top, "data": [{"title": "t", "paragraphs": [{"context": context, "qas": list(qas)}]}]}


TRAINING_FILES = [
    ({"data": []}, "no training examples"),
    ({"version": "1.1", "data": [{"title": "t", "paragraphs": []}]}, "no training examples"),
    (squad(), "no training examples"),
    (squad(qa(answers=[])), "qas[0]"),
    (squad(qa(answers=[{"text": "", "answer_start": 0}])), "answers[0]"),
    (squad(qa(question="")), "qas[0]"),
    (squad(qa(question="   ")), "qas[0]"),
    (squad(qa(), context=""), "paragraphs[0]"),
    (squad(qa("a"), qa("a")), "'a'"),
    (squad(qa(is_impossible=True, answers=[])), "is_impossible"),
    (squad(qa(is_impossible=False)), "is_impossible"),
    (squad(qa(plausible_answers=[{"text": "Berlin", "answer_start": 0}])), "plausible_answers"),
    (squad(qa(), version="v2.0"), "v2.0"),
]


@pytest.fixture()
def finetune_argv(data_test, tmp_path) -> list[str]:
    return ["--task", "squad", "--vocab-file", str(data_test / "tokenizers" / "wordpiece-vocab.txt"),
            "--device", "cpu", "--num-layers", "1", "--hidden-size", "32", "--num-attention-heads", "4",
            "--ffn-hidden-size", "64", "--max-seq-length", "40", "--doc-stride", "8", "--max-query-length", "16"]


def write(tmp_path, name, content) -> str:
    path = tmp_path / name
    path.write_text(json.dumps(content) if not isinstance(content, str) else content)
    return str(path)


@pytest.mark.parametrize(("content", "named"), TRAINING_FILES)
def test_an_unusable_training_file_is_one_line_naming_it(finetune_argv, tmp_path, content, named, capsys):
    path = write(tmp_path, "train.json", content)
    line = refused(finetune_main, finetune_argv + ["--train-file", path, "--save", str(tmp_path / "out")], capsys,
                   "finetune")
    assert path in line and named in line


@pytest.mark.parametrize(("content", "named"), [
    (squad(qa("a"), qa("a")), "'a'"),
    (squad(qa(is_impossible=True, answers=[])), "is_impossible"),
    (squad(qa(question="")), "qas[0]"),
])
def test_an_unusable_evaluation_file_is_one_line_naming_it(finetune_argv, data_test, tmp_path, content, named,
                                                           capsys):
    train = str(data_test / "squad" / "squad_sample.json")
    path = write(tmp_path, "dev.json", content)
    line = refused(finetune_main, finetune_argv + ["--train-file", train, "--valid-file", path, "--epochs", "0.01"],
                   capsys, "finetune")
    assert path in line and named in line


@pytest.mark.parametrize(("flags", "named"), [
    (["--lr-decay-style", "exponential"], "--lr-decay-style"),
    (["--lr", "inf"], "--lr"),
    (["--lr", "nan"], "--lr"),
    (["--epochs", "nan"], "--epochs"),
    (["--epochs", "inf"], "--epochs"),
    (["--min-lr", "inf"], "--min-lr"),
    (["--weight-decay", "nan"], "--weight-decay"),
    (["--lr-warmup-fraction", "inf"], "--lr-warmup-fraction"),
    (["--hidden-dropout", "nan"], "--hidden-dropout"),
    (["--seed", "-1"], "--seed"),
])
def test_finetune_flags_that_are_not_usable_numbers_or_choices_are_one_line(finetune_argv, data_test, flags, named,
                                                                            capsys):
    train = str(data_test / "squad" / "squad_sample.json")
    line = refused(finetune_main, finetune_argv + ["--train-file", train] + flags, capsys, "finetune")
    assert named in line


def test_finetune_load_hf_of_a_gpt2_directory_says_it_is_not_a_bert(finetune_argv, data_test, tmp_path, capsys):
    gpt2 = make_tiny_hf(tmp_path / "gpt2")
    capsys.readouterr()  # (transformers' progress bar while saving it)
    train = str(data_test / "squad" / "squad_sample.json")
    line = refused(finetune_main, ["--task", "squad", "--train-file", train, "--load-hf", str(gpt2), "--device", "cpu"],
                   capsys, "finetune")
    assert str(gpt2) in line and "not a BERT" in line


@pytest.mark.parametrize(("flags", "named"), [
    (["--top-k", "0"], "--top-k"),
    (["--top-k", "-3"], "--top-k"),
    (["--n-best-size", "0"], "--n-best-size"),
])
def test_predict_flags_that_would_be_ignored_are_one_line(tmp_path, flags, named, capsys):
    line = refused(predict_main, ["--load", str(tmp_path / "absent"), "--input", f"{CONTEXT} - Capital?"] + flags,
                   capsys, "predict")
    assert named in line


@pytest.mark.parametrize("strict", [[], ["--strict-lambada"]])
@pytest.mark.parametrize("passage", ["Supercalifragilisticexpialidocious", "  Hello  "])
def test_a_one_word_lambada_passage_is_one_line_naming_the_file(tiny_hf, tmp_path, strict, passage,  # noqa: F811
                                                                 capsys):
    data = tmp_path / "lambada.jsonl"
    data.write_text(json.dumps({"text": "a b c d"}) + "\n" + json.dumps({"text": passage}) + "\n")
    line = refused(evaluate_main, ["--task", "lambada", "--data", str(data), "--load", str(tiny_hf), *strict], capsys,
                   "evaluate")
    assert str(data) in line and "passage 2" in line
