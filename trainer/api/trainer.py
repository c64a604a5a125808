"""MindFormers' ``Trainer``: one object per task, with ``train``, ``evaluate`` and ``predict``.

    from trainer import Trainer
    trainer = Trainer(task="question_answering", model="bert-base-uncased/", train_dataset="./squad/",
                      eval_dataset="./squad/")
    trainer.train(resume_or_finetune_from_checkpoint=True, do_finetune=True)
    trainer.evaluate(eval_checkpoint=True)         # {'QA Metric': {'exact_match': ..., 'f1': ...}}
    trainer.predict(predict_checkpoint=True, input_data=["My name is Wolfgang and I live in Berlin - Where do I live?"])

The tasks (``question_answering``: the bert family's `trainer.models.bert.squad.task`; ``text_generation``:
the gpt family's `trainer.models.gpt.task`) run the same library calls as the ``finetune``/``predict`` and
``train``/``evaluate``/``generate`` commands. Models are local paths: MindFormers' downloadable names
(``"qa_bert_base_uncased"``) raise `trainer.errors.ModelNotLocalError`.
"""

from __future__ import annotations

import os
from typing import Any

from trainer.models import trainer_task


class Trainer:
    """One task's model, data and settings (MindFormers' ``Trainer`` signature).

    Args:
        task: ``"question_answering"`` or ``"text_generation"``.
        model: a local directory or checkpoint, or the task's model config (a fresh model of that shape).
        train_dataset / eval_dataset: the task's data (see the task's module).
        args: the task's settings (see the task's module).

    Raises:
        TrainConfigError: an unknown task, or a model, dataset or setting the task cannot use.
        ModelNotLocalError: ``model`` is a name, not a local path.
    """

    def __init__(self, task: str, model: Any = None, train_dataset: Any = None, eval_dataset: Any = None,
                 args: Any = None) -> None:
        self.task = task
        self._runner = trainer_task(task)(model=model, train_dataset=train_dataset, eval_dataset=eval_dataset,
                                          args=args)

    def train(self, resume_or_finetune_from_checkpoint: bool | str | os.PathLike | None = None,
              do_finetune: bool = True) -> Any:
        """Train (or fine-tune) on ``train_dataset``; returns the task's run result."""
        return self._runner.train(resume_or_finetune_from_checkpoint=resume_or_finetune_from_checkpoint,
                                  do_finetune=do_finetune)

    def evaluate(self, eval_checkpoint: bool | str | os.PathLike | None = True) -> dict[str, dict[str, float]]:
        """The task's metric on ``eval_dataset``: ``{'<Name> Metric': {...}}``."""
        return self._runner.evaluate(eval_checkpoint=eval_checkpoint)

    def predict(self, predict_checkpoint: bool | str | os.PathLike | None = True, input_data: Any = None,
                **options: Any) -> list[dict]:
        """The task's answers to ``input_data``; ``options`` are the task's (``top_k``, ``max_new_tokens``...)."""
        return self._runner.predict(predict_checkpoint=predict_checkpoint, input_data=input_data, **options)
