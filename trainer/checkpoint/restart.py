"""What a restarted worker resumes from (``train --max-restarts N``, torchrun's ``--max-restarts``).

torch's elastic agent starts every worker again after one of them died and counts the restarts in
``TORCHELASTIC_RESTART_COUNT`` (`trainer.parallel.distributed.restart_count`). A restarted run is the same
command, so it would start where the first attempt started; `restarted_config` points it at the attempt's own
checkpoints instead:

    config = restarted_config(config, restart_count())   # in each worker, before training
"""

from __future__ import annotations

import logging
import os
from dataclasses import replace
from pathlib import Path

from trainer.checkpoint.store import latest_iteration
from trainer.config import TrainConfig

logger = logging.getLogger(__name__)


def restarted_config(config: TrainConfig, attempt: int) -> TrainConfig:
    """``config`` for a restarted attempt: resume from the latest complete checkpoint of ``save`` (the pointer
    names only complete ones: a checkpoint the failure cut off is not among them), or, when the failed attempt
    saved none, start as the first attempt did, replacing what that attempt wrote into ``save`` (its
    metrics.jsonl). Unchanged on a first attempt or without ``save``.

    Raises:
        CheckpointError: the pointer file of ``save`` is broken.
    """
    checkpoint = config.checkpoint
    if attempt == 0 or checkpoint.save is None:
        return config
    resumes_save = checkpoint.load is not None and Path(checkpoint.load).resolve() == Path(checkpoint.save).resolve()
    if Path(checkpoint.save).is_dir() and latest_iteration(checkpoint.save) is not None:
        if int(os.environ.get("RANK", "0")) == 0:
            logger.info("restart %d: resuming from the latest complete checkpoint in %s", attempt,
                        checkpoint.save)
        checkpoint = replace(checkpoint, load=checkpoint.save, load_hf=None, overwrite_save=False)
    elif not resumes_save:
        checkpoint = replace(checkpoint, overwrite_save=True)
    return replace(config, checkpoint=checkpoint)
