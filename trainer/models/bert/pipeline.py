"""BERT pipeline stages: a manual split of the full model, parameter names unchanged.

Each stage is a deep copy of the full model with the layers outside its range deleted, the embeddings
kept on the first stage only and the heads (pooler, binary, MLM or span head) on the last stage only;
parameter names therefore stay those of the full model. Stages pass (hidden states, attention bias)
on (`trainer.models.bert.model.Bert.forward`). The last stage's MLM decoder is a copy of the word
embedding whose gradient is summed with the first stage's (`trainer.parallel.pipeline.tied_embedding_group`).
"""

from __future__ import annotations

import copy

from trainer.errors import TrainConfigError
from trainer.models.bert.model import Bert


def split_stage(model: Bert, stage_id: int, num_stages: int) -> Bert:
    """A copy of ``model`` restricted to stage ``stage_id`` of ``num_stages`` equal layer ranges.

    Raises:
        TrainConfigError: the layers do not divide by the number of stages.
    """
    num_layers = model.shape.num_layers
    if num_layers % num_stages:
        raise TrainConfigError(f"num_layers ({num_layers}) is not divisible by the number of pipeline stages "
                               f"({num_stages})")
    stage = copy.deepcopy(model)
    per_stage = num_layers // num_stages
    keep = range(stage_id * per_stage, (stage_id + 1) * per_stage)
    for name in list(stage.layers.keys()):
        if int(name) not in keep:
            del stage.layers[name]
    if stage_id != 0:
        stage.word_embeddings = stage.position_embeddings = stage.token_type_embeddings = None
        stage.embedding_norm = stage.embedding_dropout = None
    if stage_id != num_stages - 1:
        stage.drop_heads()
    return stage
