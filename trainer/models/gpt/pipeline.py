"""GPT pipeline stages: a manual split of the full model, parameter names unchanged.

Each stage is a deep copy of the full model with the layers outside its range deleted and the
embeddings (first stage only) or norm and head (last stage only) set to None; parameter names therefore
stay those of the full model, and `GPT.forward` skips what is missing.
"""

from __future__ import annotations

import copy

from trainer.models.gpt.model import GPT


def split_stage(model: GPT, stage_id: int, num_stages: int) -> GPT:
    """A copy of ``model`` restricted to stage ``stage_id`` of ``num_stages`` equal layer ranges."""
    stage = copy.deepcopy(model)
    layers_per_stage = model.shape.num_layers // num_stages
    keep = range(stage_id * layers_per_stage, (stage_id + 1) * layers_per_stage)
    for name in list(stage.layers.keys()):
        if int(name) not in keep:
            del stage.layers[name]
    if stage_id != 0:
        stage.tok_embeddings = stage.pos_embeddings = stage.embedding_dropout = None
    if stage_id != num_stages - 1:
        stage.norm = stage.output = None
    return stage
