"""``from trainer import Trainer``: MindFormers' question-answering snippet runs with only its import line changed
and local paths (issue 33).

Promised: ``Trainer(task="question_answering", model=<local HF BERT directory>, train_dataset="./squad/",
eval_dataset="./squad/")`` fine-tunes with ``train(resume_or_finetune_from_checkpoint=..., do_finetune=True)``,
``evaluate(eval_checkpoint=True)`` returns ``{'QA Metric': {'exact_match', 'f1'}}`` (the figures the ``finetune``
command prints for the same checkpoint: one code path), and ``predict(predict_checkpoint=True, input_data=[...])``
returns MindFormers' list of answers (what ``predict`` prints). MindFormers' downloadable names
(``"qa_bert_base_uncased"``) and other unusable arguments are one clear `TokenmillError` naming the argument;
importing ``trainer`` does not import the API.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
from test_bert_hf import make_hf_bert

from indexed_dataset.errors import TokenmillError
from trainer.errors import ModelNotLocalError, TrainConfigError
from trainer.models.bert.squad.finetune_cli import main as finetune_main
from trainer.models.bert.squad.predict_cli import main as predict_main

QUESTION = "My name is Wolfgang and I live in Berlin - Where do I live?"
SUBPROCESS_TIMEOUT_S = 120


@pytest.fixture(scope="module")
def squad_run(data_test, tmp_path_factory):
    """The MindFormers snippet, run in a fresh folder holding ./squad/ (the bundled SQuAD sample as
    train-v1.1.json and dev-v1.1.json) and ./bert/ (a tiny random HF BERT with the WordPiece test vocab)."""
    root = tmp_path_factory.mktemp("mindformers")
    (root / "squad").mkdir()
    for name in ("train-v1.1.json", "dev-v1.1.json"):
        shutil.copyfile(data_test / "squad" / "squad_sample.json", root / "squad" / name)
    make_hf_bert(root / "bert", "BertForPreTraining")
    shutil.copyfile(data_test / "tokenizers" / "wordpiece-vocab.txt", root / "bert" / "vocab.txt")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(root)
        from trainer import Trainer  # the one line changed: `from mindformers.trainer import Trainer`

        trainer = Trainer(task='question_answering', model='./bert/', train_dataset='./squad/',
                          eval_dataset='./squad/')
        trainer.train(resume_or_finetune_from_checkpoint="./bert/", do_finetune=True)
        metric = trainer.evaluate(eval_checkpoint=True)
        answers = trainer.predict(predict_checkpoint=True, input_data=[QUESTION])
    return root, trainer, metric, answers


def test_evaluate_returns_the_qa_metric_of_the_finetune_command(squad_run, capsys):
    root, _, metric, _ = squad_run
    assert set(metric) == {"QA Metric"} and set(metric["QA Metric"]) == {"exact_match", "f1"}
    assert (root / "output" / "checkpoint" / "latest_checkpointed_iteration.txt").is_file()
    sample = str(root / "squad" / "dev-v1.1.json")
    assert finetune_main(["--task", "squad", "--valid-file", sample, "--load", str(root / "output" / "checkpoint"),
                          "--output-dir", str(root / "cli_eval"), "--device", "cpu"]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == str(metric["QA Metric"])


def test_predict_returns_mindformers_answers_as_the_predict_command(squad_run, capsys):
    root, _, _, answers = squad_run
    assert len(answers) == 1 and set(answers[0]) == {"text", "score", "start", "end"}
    context = QUESTION.rpartition(" - ")[0]
    assert context[answers[0]["start"]:answers[0]["end"]] == answers[0]["text"]
    assert predict_main(["--load", str(root / "output" / "checkpoint"), "--input", QUESTION, "--json",
                         "--device", "cpu"]) == 0
    assert json.loads(capsys.readouterr().out) == {"0": answers}


def test_a_path_given_to_evaluate_or_predict_is_used(squad_run):
    root, trainer, metric, answers = squad_run
    checkpoint = str(root / "output" / "checkpoint")
    assert trainer.evaluate(eval_checkpoint=checkpoint) == metric
    assert trainer.predict(predict_checkpoint=checkpoint, input_data=QUESTION, top_k=2)[0] == answers[0]


@pytest.mark.parametrize("build, call, names", [
    (dict(model="qa_bert_base_uncased"), None, "model: 'qa_bert_base_uncased'"),
    (dict(model="BERT"), lambda t: t.train(resume_or_finetune_from_checkpoint="qa_bert_base_uncased"),
     "resume_or_finetune_from_checkpoint: 'qa_bert_base_uncased'"),
    (dict(model="BERT"), lambda t: t.evaluate(eval_checkpoint="qa_bert_base_uncased"), "eval_checkpoint:"),
    (dict(model="BERT"), lambda t: t.predict(predict_checkpoint="qa_bert_base_uncased", input_data=[QUESTION]),
     "predict_checkpoint:"),
], ids=["model", "train", "evaluate", "predict"])
def test_mindformers_names_say_to_pass_a_local_directory(build, call, names, squad_run):
    from trainer import Trainer

    root = squad_run[0]
    options = {**build, "model": str(root / "bert") if build["model"] == "BERT" else build["model"]}
    with pytest.raises(ModelNotLocalError) as error:
        call(Trainer(task="question_answering", **options)) if call else Trainer(task="question_answering", **options)
    message = str(error.value)
    assert message.startswith(names) and "local" in message and len(message.splitlines()) == 1


@pytest.mark.parametrize("build, call, names", [
    (dict(task="summarization"), None, "task: unknown task 'summarization'"),
    (dict(train_dataset="nowhere/"), None, "train_dataset: nowhere is no SQuAD file"),
    (dict(args={"epochs": 1, "learning_rate": 1}), None, "args: unknown setting 'learning_rate'"),
    (dict(args={"load": "x"}), None, "args: load comes from the Trainer's"),
    (dict(), lambda t: t.train(), "train: the Trainer was given no train_dataset"),
    (dict(), lambda t: t.train(resume_or_finetune_from_checkpoint=True, do_finetune=False), "do_finetune=False"),
    (dict(), lambda t: t.evaluate(), "evaluate: the Trainer was given no eval_dataset"),
    (dict(), lambda t: t.predict(input_data=["no separator"]), "input 0: expected 'context - question'"),
], ids=["task", "dataset", "setting", "source-setting", "no-train-data", "resume", "no-eval-data", "input"])
def test_unusable_arguments_are_one_clear_error(build, call, names, squad_run):
    from trainer import Trainer

    options = {"task": "question_answering", "model": str(squad_run[0] / "bert"), **build}
    with pytest.raises(TokenmillError) as error:
        call(Trainer(**options)) if call else Trainer(**options)
    assert str(error.value).startswith(names) and len(str(error.value).splitlines()) == 1
    assert isinstance(error.value, (TrainConfigError, ValueError))


def test_importing_trainer_leaves_the_api_unloaded():
    code = ("import sys, trainer; assert 'trainer.api.trainer' not in sys.modules; "
            "assert 'torch' not in sys.modules; from trainer import Trainer; print(Trainer.__module__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         timeout=SUBPROCESS_TIMEOUT_S).stdout
    assert out.strip() == "trainer.api.trainer"
