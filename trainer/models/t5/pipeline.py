"""Pipeline parallelism for T5: the encoder and decoder layers split into stages, encoder output carried on.

    stage = split_t5_stage(model, stage_id=1, num_stages=2)
    schedule = trainer.parallel.pipeline.build_schedule([stage], [1], 2, mesh["pp"], device, n_micro, "1f1b", loss_fn)
    schedule.step(encoder_ids, decoder_ids, encoder_mask, target=targets)   # first stage passes the inputs

The encoder layers followed by the decoder layers form one list of Ne + Nd layers, cut into
``num_stages`` equal ranges (stage boundaries may fall inside the encoder or the decoder). Each stage
is a deep copy of the model with the other layers deleted and the parts it does not own set to None,
so parameter names are the full model's: the token embedding on stage 0; the encoder's final norm
and the decoder's position-bias table on the stage holding decoder layer 0; the decoder norm and
head on the last stage. What travels between stages is described in
`trainer.models.t5.model.T5.pipeline_stage_forward`; the first stage embeds the decoder ids too, so the
embedding is not duplicated for the decoder. A tied head (T5 v1.0) is a copy on the last stage whose
gradient is summed with stage 0's (`trainer.parallel.pipeline.tied_embedding_group` and
`trainer.optim.grads.sync_tied_embedding_grad`, as for GPT).
"""

from __future__ import annotations

import copy

from trainer.models.t5.model import T5


def t5_stage_layers(num_encoder_layers: int, num_decoder_layers: int, stage_id: int,
                    num_stages: int) -> tuple[range, range]:
    """The encoder and decoder layer ids of stage ``stage_id``.

    Raises:
        ValueError: Ne + Nd is not divisible by ``num_stages``.
    """
    total = num_encoder_layers + num_decoder_layers
    if total % num_stages:
        raise ValueError(f"encoder + decoder layers ({num_encoder_layers} + {num_decoder_layers}) are not divisible "
                         f"by the number of pipeline stages ({num_stages})")
    per_stage = total // num_stages
    begin, end = stage_id * per_stage, (stage_id + 1) * per_stage
    encoder = range(min(begin, num_encoder_layers), min(end, num_encoder_layers))
    decoder = range(max(begin - num_encoder_layers, 0), max(end - num_encoder_layers, 0))
    return encoder, decoder


def split_t5_stage(model: T5, stage_id: int, num_stages: int) -> T5:
    """A copy of ``model`` restricted to stage ``stage_id`` of ``num_stages``, in pipeline-stage mode."""
    shape = model.shape
    encoder, decoder = t5_stage_layers(shape.num_encoder_layers, shape.num_decoder_layers, stage_id, num_stages)
    stage = copy.deepcopy(model)
    stage.pipeline_stage = True
    for layers, keep in ((stage.encoder_layers, encoder), (stage.decoder_layers, decoder)):
        for name in list(layers.keys()):
            if int(name) not in keep:
                del layers[name]
    if stage_id != 0:
        stage.shared = stage.encoder_position_bias = None
    if stage_id != num_stages - 1:
        stage.decoder_norm = stage.output = None
    if 0 not in decoder:
        stage.encoder_norm = stage.decoder_position_bias = None
    return stage
