"""MindFormers' ``Trainer(task="text_generation")`` for GPT: ``train`` is `trainer.train.train`, ``evaluate`` the
perplexity of `trainer.evaluation.evaluate`, ``predict`` is `trainer.models.dispatch.generate` (the
``train``, ``evaluate --task perplexity`` and ``generate`` commands' library calls); `trainer.Trainer` finds it
through the gpt family's ``ModelSpec.tasks``.

    trainer = Trainer(task="text_generation", model=ModelConfig(num_layers=2, hidden_size=64, ...),
                      train_dataset="data/corpus_text_document", eval_dataset="data/wiki.test.tokens",
                      args=TrainConfig(training=TrainingConfig(train_iters=100, global_batch_size=8), ...))
    trainer.train()                                   # TrainResult; the checkpoint goes to args' save
    trainer.evaluate(eval_checkpoint=True)            # {'Perplexity Metric': {'ppl': ..., 'adjusted_ppl': ...}}
    trainer.predict(input_data=["Hello, my name is"], max_new_tokens=20)
    # [{'text_generation_text': ['Hello, my name is ...'], 'ids': [...]}]

``model``: a `ModelConfig` (a fresh GPT of that shape), a local HF GPT-2 directory or a tokenmill checkpoint
(whose shape and tokenizer then replace ``args``' as ``train --load-hf``/``--load`` take them).
``train_dataset``: a token dataset prefix or Megatron's data-path list (None: args' data paths).
``eval_dataset``: a text file or a ``.bin/.idx`` token file. ``args``: a `TrainConfig` (its model, data path
and checkpoint sources are replaced).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from trainer.checkpoint.hf_files import is_hf_directory
from trainer.checkpoint.local_source import DEFAULT_SAVE, chosen_source, local_model_path
from trainer.config import ModelConfig, TrainConfig
from trainer.errors import TrainConfigError
from trainer.evaluation.evaluate import EvaluateConfig, evaluate
from trainer.evaluation.scoring import EvalModelConfig
from trainer.generation.generate import GenerateConfig
from trainer.models.dispatch import checkpoint_train_defaults, generate, resolve_scoring_source
from trainer.models.gpt.convert import hf_train_defaults
from trainer.train import TrainResult, train

TASK_NAME = "text_generation"
PERPLEXITY_TASK = "perplexity"


def with_sections(config: TrainConfig, sections: dict[str, dict[str, Any]]) -> TrainConfig:
    """``config`` with the fields of each `TrainConfig` section in ``sections`` replaced."""
    return dataclasses.replace(config, **{name: dataclasses.replace(getattr(config, name), **values)
                                          for name, values in sections.items()})


class TextGenerationTask:
    """Train, score and generate with a GPT, as MindFormers' text-generation Trainer."""

    def __init__(self, model: ModelConfig | str | os.PathLike | None, train_dataset: str | list[str] | None,
                 eval_dataset: str | os.PathLike | None, args: TrainConfig | None) -> None:
        if args is not None and not isinstance(args, TrainConfig):
            raise TrainConfigError(f"args: expected a TrainConfig, got {type(args).__name__}")
        if model is not None and not isinstance(model, ModelConfig):
            model = local_model_path(model, "model")
        self._config = args or TrainConfig()
        if isinstance(model, ModelConfig):
            self._config = dataclasses.replace(self._config, model=model)
        self._model = model if isinstance(model, str) else None
        self._data_path = [train_dataset] if isinstance(train_dataset, (str, os.PathLike)) else train_dataset
        self._eval_file = os.path.abspath(eval_dataset) if eval_dataset is not None else None
        self._trained: str | None = None

    def train(self, resume_or_finetune_from_checkpoint: bool | str | os.PathLike | None = None,
              do_finetune: bool = True) -> TrainResult:
        """Train on ``train_dataset`` from the model named (a local path; True, False or None: the Trainer's
        model); saves into args' ``checkpoint.save`` (default output/checkpoint).

        A HF directory starts a run from its weights (``train --load-hf``; naming one with ``do_finetune=False``,
        MindFormers' resumption, is refused: it holds no training state). A tokenmill checkpoint is loaded as
        ``train --load`` loads it whatever ``do_finetune`` says: with the optimizer state and counters it holds
        (none for one `convert-checkpoint --from-hf` wrote, which then starts a fine-tuning run).
        """
        choice = resume_or_finetune_from_checkpoint
        start = (local_model_path(choice, "resume_or_finetune_from_checkpoint")
                 if isinstance(choice, (str, os.PathLike)) else self._model)
        config = self._config
        data = config.data
        if self._data_path is None and not (data.data_path or data.dataset or data.train_data_path or data.mock_data):
            raise TrainConfigError("train: the Trainer was given no train_dataset (nor args with a data path or "
                                   "mock_data)")
        checkpoint = {"save": os.path.abspath(config.checkpoint.save or DEFAULT_SAVE), "load": None, "load_hf": None}
        sections: dict[str, dict[str, Any]] = {}
        if start is not None and is_hf_directory(start):
            if not do_finetune and choice not in (None, False):
                raise TrainConfigError(f"do_finetune=False: {start} is a Hugging Face directory, which holds no "
                                       "training state to resume; pass do_finetune=True")
            sections, checkpoint["load_hf"] = hf_train_defaults(start), start
        elif start is not None:
            sections, checkpoint["load"] = checkpoint_train_defaults(start), start
        paths = {} if self._data_path is None else {"dataset": [], "data_path": [str(p) for p in self._data_path]}
        config = with_sections(config, {**sections, "checkpoint": checkpoint, "data": {**sections.get("data", {}),
                                                                                     **paths}})
        result = train(config)
        self._trained = checkpoint["save"]
        return result

    def evaluate(self, eval_checkpoint: bool | str | os.PathLike | None = True) -> dict[str, dict[str, Any]]:
        """The perplexity of ``eval_dataset`` (`trainer.evaluation.evaluate`, task perplexity).

        Args:
            eval_checkpoint: True: the checkpoint ``train`` saved, else the Trainer's model; False: the
                Trainer's model; a path: that local checkpoint or HF directory.

        Returns:
            ``{'Perplexity Metric': record}``: ``evaluate``'s record (``ppl``, ``adjusted_ppl``, ...).
        """
        load = chosen_source(eval_checkpoint, self._trained, self._model, "eval_checkpoint")
        if self._eval_file is None:
            raise TrainConfigError("evaluate: the Trainer was given no eval_dataset")
        model = EvalModelConfig(load=load, device=self._config.training.device, progress=False)
        config = EvaluateConfig(model=model, task=PERPLEXITY_TASK, data=self._eval_file)
        return {"Perplexity Metric": evaluate(config, resolve_scoring_source(load, model.tensor_model_parallel_size))}

    def predict(self, predict_checkpoint: bool | str | os.PathLike | None = True,
                input_data: str | list[str] | list[list[int]] | None = None, **options: Any) -> list[dict]:
        """Continue each prompt (`trainer.generation.generate.generate`).

        Args:
            input_data: prompt texts (need the model's tokenizer) or token-id lists.
            options: `GenerateConfig` fields (``max_new_tokens``, ``sampling``, ``seed``, ``tokenizer``...).

        Returns:
            Per prompt, in order: ``{'text_generation_text': [text], 'ids': generated ids}``; the text is the
            prompt and its continuation for a text prompt, the continuation for an id prompt (None without a
            tokenizer).
        """
        if not input_data:
            raise TrainConfigError("predict: give input_data (prompt texts or token-id lists)")
        prompts = [input_data] if isinstance(input_data, str) else list(input_data)
        load = chosen_source(predict_checkpoint, self._trained, self._model, "predict_checkpoint")
        texts = [p for p in prompts if isinstance(p, str)]
        ids = [list(p) for p in prompts if not isinstance(p, str)]
        options = {"device": self._config.training.device, **options}
        completions = iter(generate(GenerateConfig(load=load, prompts=texts, prompt_ids=ids, **options)))
        by_text = [next(completions) for _ in texts]  # generate answers the texts first, then the id prompts
        by_ids = list(completions)
        answers = []
        for prompt in prompts:
            done = by_text.pop(0) if isinstance(prompt, str) else by_ids.pop(0)
            full = None if done.text is None else (prompt if isinstance(prompt, str) else "") + done.text
            answers.append({"text_generation_text": [full], "ids": done.ids})
        return answers


TASK = TextGenerationTask
