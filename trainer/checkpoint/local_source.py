"""The models of the Python `Trainer` (`trainer.api`): local paths only, and which one each call uses.

    path = local_model_path("bert-base-uncased/", "model")        # a local directory: its path
    local_model_path("qa_bert_base_uncased", "model")              # ModelNotLocalError: pass a local directory
    chosen_source(True, trained="output/checkpoint", given="bert/", what="eval_checkpoint")  # the trained one

MindFormers names the checkpoints it downloads; tokenmill reads local files only and downloads nothing.
"""

from __future__ import annotations

import os
from pathlib import Path

from trainer.errors import ModelNotLocalError, TrainConfigError

# Where a `Trainer` run saves when its settings name no directory: MindFormers' ``output_dir`` default
# ("./output"), with the checkpoint in a folder of its own.
DEFAULT_OUTPUT_DIR = "output"
CHECKPOINT_FOLDER = "checkpoint"
DEFAULT_SAVE = str(Path(DEFAULT_OUTPUT_DIR) / CHECKPOINT_FOLDER)


def local_model_path(value: str | os.PathLike, what: str) -> str:
    """``value`` as an absolute path when it names an existing local file or directory.

    Raises:
        ModelNotLocalError: ``value`` is a name, not a local path (one line naming ``what``).
        TrainConfigError: ``value`` is not a path at all.
    """
    if not isinstance(value, (str, os.PathLike)):
        raise TrainConfigError(f"{what}: expected a local directory or checkpoint path, got {type(value).__name__}")
    if not Path(value).exists():
        raise ModelNotLocalError(f"{what}: {str(value)!r} is no local file or directory; tokenmill downloads no "
                                 "named checkpoints: pass a local Hugging Face directory or a tokenmill checkpoint")
    return os.path.abspath(value)  # the Trainer keeps it: a later change of directory does not move it


def chosen_source(choice: bool | str | os.PathLike | None, trained: str | None, given: str | None,
                  what: str) -> str:
    """The model a MindFormers-style ``eval_checkpoint`` / ``predict_checkpoint`` argument names.

    Args:
        choice: True: the checkpoint the last ``train`` saved, else the model the `Trainer` was given;
            False or None: the model the `Trainer` was given; a path: that local model.
        trained: the checkpoint ``train`` saved (None before training).
        given: the local model the `Trainer` was given (None: a fresh one of a model config).

    Raises:
        ModelNotLocalError / TrainConfigError: ``choice`` is no local path, or there is no model to use.
    """
    if isinstance(choice, (str, os.PathLike)):
        return local_model_path(choice, what)
    source = trained if choice is True and trained is not None else given
    if source is None:
        raise TrainConfigError(f"{what}: no trained model yet (the Trainer's model is a fresh model config): call "
                               "train() first or pass a local checkpoint path")
    return source
