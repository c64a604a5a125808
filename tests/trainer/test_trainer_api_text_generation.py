"""``Trainer(task="text_generation")``: MindFormers' snippet for GPT (issue 33).

Promised: with a model config, the tiny token file as train and eval data and a `TrainConfig` as args,
``train()`` is `trainer.train.train` (the same losses as calling it with the same config), ``evaluate()``
returns ``{'Perplexity Metric': record}`` with the record the ``evaluate --task perplexity`` command prints for
the saved checkpoint, and ``predict(input_data=[ids])`` gives the ids the ``generate`` command gives; a
downloadable name is one clear error, as for question answering.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from trainer_testing import tiny_config

from indexed_dataset import IndexedDataset, IndexedDatasetWriter
from trainer.cli.evaluate import main as evaluate_main
from trainer.cli.generate import main as generate_main
from trainer.config import CheckpointConfig
from trainer.errors import ModelNotLocalError, TrainConfigError
from trainer.generation.sampling import SamplingConfig
from trainer.train import train

STEPS = 4
# Tokens of the evaluation file: a few windows of the tiny model's 32 positions (scoring the whole sample file
# costs minutes on a shared CPU).
EVAL_TOKENS = 200
PROMPT = [5, 17, 42]
NEW_TOKENS = 4


@pytest.fixture(scope="module")
def gpt_run(tiny_prefix, cache_dir, tmp_path_factory):
    from trainer import Trainer

    root = tmp_path_factory.mktemp("gpt_api")
    eval_prefix = str(root / "eval_text_document")
    with IndexedDatasetWriter(eval_prefix, np.uint16) as writer:
        writer.add_document(np.asarray(IndexedDataset(tiny_prefix)[0][:EVAL_TOKENS]), [EVAL_TOKENS])
    config = tiny_config(tiny_prefix, cache_dir, train_iters=STEPS, num_layers=2)
    args = dataclasses.replace(config, checkpoint=CheckpointConfig(save=str(root / "ckpt")))
    trainer = Trainer(task="text_generation", model=config.model, train_dataset=tiny_prefix,
                      eval_dataset=eval_prefix, args=args)
    result = trainer.train()
    metric = trainer.evaluate(eval_checkpoint=True)
    answers = trainer.predict(predict_checkpoint=True, input_data=[PROMPT], max_new_tokens=NEW_TOKENS,
                              sampling=SamplingConfig(greedy=True))
    return root, config, result, metric, answers, eval_prefix


def test_train_is_the_train_function(gpt_run):
    _, config, result, _, _, _ = gpt_run
    assert len(result.losses) == STEPS
    assert result.losses == pytest.approx(train(config).losses, rel=1e-6)


def test_evaluate_is_the_perplexity_of_the_evaluate_command(gpt_run, capsys):
    root, _, _, metric, _, eval_prefix = gpt_run
    capsys.readouterr()
    assert evaluate_main(["--task", "perplexity", "--data", eval_prefix, "--load", str(root / "ckpt"),
                          "--device", "cpu", "--json"]) == 0
    assert metric == {"Perplexity Metric": json.loads(capsys.readouterr().out.strip().splitlines()[-1])}


def test_predict_is_the_generate_command(gpt_run, capsys):
    root, _, _, _, answers, _ = gpt_run
    capsys.readouterr()
    assert generate_main(["--load", str(root / "ckpt"), "--prompt-ids", " ".join(map(str, PROMPT)),
                          "--max-new-tokens", str(NEW_TOKENS), "--greedy", "--device", "cpu", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert answers == [{"text_generation_text": [None], "ids": printed["ids"]}]


@pytest.mark.parametrize("build, error, names", [
    (dict(model="gpt2_small"), ModelNotLocalError, "model: 'gpt2_small'"),
    (dict(args={"train_iters": 3}), TrainConfigError, "args: expected a TrainConfig"),
], ids=["name", "args"])
def test_unusable_arguments_are_one_clear_error(build, error, names):
    from trainer import Trainer

    with pytest.raises(error) as raised:
        Trainer(task="text_generation", **build)
    assert str(raised.value).startswith(names) and len(str(raised.value).splitlines()) == 1
