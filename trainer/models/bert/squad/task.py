"""MindFormers' ``Trainer(task="question_answering")``: the ``finetune`` and ``predict`` library calls
(`trainer.models.bert.squad.finetune`) behind MindFormers' method names; `trainer.Trainer` finds it through the
bert family's ``ModelSpec.tasks``.

    trainer = Trainer(task="question_answering", model="bert-base-uncased/", train_dataset="squad/",
                      eval_dataset="squad/", args={"epochs": 2, "save": "ckpt/squad"})
    trainer.train(resume_or_finetune_from_checkpoint=True, do_finetune=True)
    trainer.evaluate(eval_checkpoint=True)            # {'QA Metric': {'exact_match': ..., 'f1': ...}}
    trainer.predict(predict_checkpoint=True, input_data=["Berlin is ... - Where ...?"])
    # [{'text': 'Berlin', 'score': 0.99, 'start': 0, 'end': 6}]

``model``: a local HF BERT directory, a tokenmill BERT checkpoint (pre-trained or fine-tuned), or a
`ScratchShape` (a fresh encoder of that size; it needs ``args={"vocab_file": ...}``). ``args``: the fields of
`SquadConfig` other than the files and the model (a dict, or a `SquadConfig` whose files and model are replaced).
Features not given are fitted to the model's positions, as the commands fit them.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from pathlib import Path
from typing import Any

from trainer.checkpoint.hf_files import is_hf_directory
from trainer.checkpoint.local_source import DEFAULT_SAVE, chosen_source, local_model_path
from trainer.errors import TrainConfigError
from trainer.models.bert.squad.cli import feature_options, model_positions
from trainer.models.bert.squad.examples import parse_predict_inputs
from trainer.models.bert.squad.features import FeatureOptions
from trainer.models.bert.squad.finetune import PredictConfig, ScratchShape, SquadConfig, SquadResult, finetune, predict

TASK_NAME = "question_answering"
# The files a SQuAD v1.1 folder holds (MindFormers' "./squad/").
TRAIN_FILE = "train-v1.1.json"
DEV_FILE = "dev-v1.1.json"
# `SquadConfig` fields the Trainer's own arguments set (the files and the model), not ``args``.
SOURCE_FIELDS = ("train_file", "valid_file", "load", "load_hf", "scratch")
SETTINGS = tuple(f.name for f in dataclasses.fields(SquadConfig) if f.name not in SOURCE_FIELDS)
# The settings evaluation and prediction read (fine-tuning reads them all).
PREDICT_SETTINGS = ("vocab_file", "lower_case", "n_best_size", "max_answer_length", "device")


def squad_file(path: str | os.PathLike, name: str, what: str) -> str:
    """A SQuAD-format file given as itself, or as the folder that holds ``name``.

    Raises:
        TrainConfigError: no such file (one line naming ``what`` and the path).
    """
    file = Path(path) / name if Path(path).is_dir() else Path(path)
    if not file.is_file():
        raise TrainConfigError(f"{what}: {file} is no SQuAD file (a folder must hold {name})")
    return os.path.abspath(file)


def _settings(args: SquadConfig | dict[str, Any] | None) -> dict[str, Any]:
    if args is None:
        return {}
    if isinstance(args, SquadConfig):
        return {name: getattr(args, name) for name in SETTINGS}
    if not isinstance(args, dict):
        raise TrainConfigError("args: expected a dict of SquadConfig fields or a SquadConfig, "
                               f"got {type(args).__name__}")
    for name in args:
        if name in SOURCE_FIELDS:
            raise TrainConfigError(f"args: {name} comes from the Trainer's model/train_dataset/eval_dataset, not args")
        if name not in SETTINGS:
            raise TrainConfigError(f"args: unknown setting {name!r} of {TASK_NAME}; known: {', '.join(SETTINGS)}")
    return dict(args)


def _source_fields(path: str | None) -> dict[str, str | None]:
    """SquadConfig's ``load_hf`` (a HF directory) or ``load`` (a tokenmill checkpoint) for ``path``."""
    if path is None:
        return {"load": None, "load_hf": None}
    return {"load": None, "load_hf": path} if is_hf_directory(path) else {"load": path, "load_hf": None}


class QuestionAnsweringTask:
    """Fine-tune, evaluate and predict with a BERT span model, as MindFormers' question-answering Trainer."""

    def __init__(self, model: str | os.PathLike | ScratchShape | None, train_dataset: str | os.PathLike | None,
                 eval_dataset: str | os.PathLike | None, args: SquadConfig | dict[str, Any] | None) -> None:
        self._scratch = model if isinstance(model, ScratchShape) else ScratchShape()
        self._model = None if model is None or isinstance(model, ScratchShape) else local_model_path(model, "model")
        self._train_file = squad_file(train_dataset, TRAIN_FILE, "train_dataset") if train_dataset is not None else None
        self._eval_file = squad_file(eval_dataset, DEV_FILE, "eval_dataset") if eval_dataset is not None else None
        self._settings = _settings(args)
        self._trained: str | None = None

    def _features(self, source: dict[str, str | None]) -> FeatureOptions:
        """The settings' features, else the commands' defaults fitted to the model's positions."""
        if "features" in self._settings:
            return self._settings["features"]
        unset = argparse.Namespace(max_seq_length=None, doc_stride=None, max_query_length=None)
        return feature_options(unset, model_positions(source["load"], source["load_hf"]))

    def train(self, resume_or_finetune_from_checkpoint: bool | str | os.PathLike | None = None,
              do_finetune: bool = True) -> SquadResult:
        """Fine-tune on ``train_dataset`` (`finetune`), from the checkpoint named (a local path; True, False or
        None: the Trainer's model); saves into the settings' ``save`` (default output/checkpoint).

        Raises:
            TrainConfigError: no train_dataset, or a checkpoint named with ``do_finetune=False`` (MindFormers'
                resumption: SQuAD fine-tuning keeps no optimizer state to resume); the errors of `finetune`.
        """
        choice = resume_or_finetune_from_checkpoint
        if not do_finetune and choice not in (None, False):
            raise TrainConfigError(f"do_finetune=False: {TASK_NAME} runs start from a model's weights and keep no "
                                   "optimizer state to resume; pass do_finetune=True")
        source = _source_fields(local_model_path(choice, "resume_or_finetune_from_checkpoint")
                                if isinstance(choice, (str, os.PathLike)) else self._model)
        if self._train_file is None:
            raise TrainConfigError("train: the Trainer was given no train_dataset")
        settings = {**self._settings, "save": os.path.abspath(self._settings.get("save") or DEFAULT_SAVE),
                    "features": self._features(source)}
        result = finetune(SquadConfig(train_file=self._train_file, scratch=self._scratch, **source, **settings))
        self._trained = settings["save"]
        return result

    def evaluate(self, eval_checkpoint: bool | str | os.PathLike | None = True) -> dict[str, dict[str, float]]:
        """The official SQuAD v1.1 metric on ``eval_dataset`` (`finetune` without a training file).

        Args:
            eval_checkpoint: True: the model ``train`` saved, else the Trainer's model; False: the Trainer's
                model; a path: that local checkpoint or HF directory.

        Returns:
            ``{'QA Metric': {'exact_match': ..., 'f1': ...}}`` (percentages); predictions.json,
            nbest_predictions.json and eval_results.json go to the settings' output_dir (default: save).
        """
        source = _source_fields(chosen_source(eval_checkpoint, self._trained, self._model, "eval_checkpoint"))
        if self._eval_file is None:
            raise TrainConfigError("evaluate: the Trainer was given no eval_dataset")
        settings = {**self._settings, "features": self._features(source)}
        result = finetune(SquadConfig(valid_file=self._eval_file, **source, **settings))
        return {"QA Metric": result.metrics}

    def predict(self, predict_checkpoint: bool | str | os.PathLike | None = True,
                input_data: str | list[str] | None = None, top_k: int = 1) -> list[dict]:
        """Answer MindFormers' ``"context - question"`` strings with a fine-tuned span model (`predict`).

        Returns:
            The ``top_k`` best answers of each input, in input order: ``{'text', 'score', 'start', 'end'}``
            (start and end: characters of the context).
        """
        if input_data is None:
            raise TrainConfigError("predict: give input_data ('context - question' strings)")
        examples = parse_predict_inputs([input_data] if isinstance(input_data, str) else list(input_data))
        load = chosen_source(predict_checkpoint, self._trained, self._model, "predict_checkpoint")
        options = {name: self._settings[name] for name in PREDICT_SETTINGS if name in self._settings}
        answers = predict(PredictConfig(load=load, features=self._features(_source_fields(load)), top_k=top_k,
                                        **options), examples)
        return [answer for example in examples for answer in answers[example.id]]


TASK = QuestionAnsweringTask
