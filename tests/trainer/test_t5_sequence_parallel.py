"""T5 under sequence parallelism (tensor parallelism 2 with the residual streams split along the sequence).

The encoder's and decoder's residual streams, norms and the dropout after them hold 1/tp of the sequence;
attention, cross-attention (over the gathered encoder output) and the MLP see whole sequences. One 2-process
launch trains the tiny T5 of `test_t5_parallel` (v1.0 and mT5) for STEPS AdamW steps under each layout; the
per-step losses must follow the single-process run, and tensor parallelism without it, within LOSS_TOLERANCE.
With keyed dropout on, the sequence-parallel run draws the single process's masks, so it follows it too.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from process_testing import run_jobs
from test_t5_parallel import LOSS_TOLERANCE, MT5, STEPS, V1_0, make_batches, run_parallel_t5
from trainer_testing import t5_config

from trainer.data.batches import SAMPLE_ID_KEY
from trainer.errors import TrainConfigError
from trainer.models import model_spec
from trainer.models.t5.settings import t5_settings
from trainer.parallel.dims import resolve_parallel_dims

DROPOUT = 0.1
V1_0_DROPOUT = V1_0 | dict(dropout_rate=DROPOUT)
SEQUENCE_PARALLEL = dict(tp=2, sequence_parallel=True)
# name: (variant, layout, name of the run it must follow besides the single process's, or None)
LAYOUTS = {
    "tp2 v1.0": (V1_0, dict(tp=2), None),
    "tp2 mt5": (MT5, dict(tp=2), None),
    "tp2 sp v1.0": (V1_0, SEQUENCE_PARALLEL, "tp2 v1.0"),
    "tp2 sp mt5": (MT5, SEQUENCE_PARALLEL, "tp2 mt5"),
    "tp2 sp v1.0 keyed dropout": (V1_0_DROPOUT, SEQUENCE_PARALLEL | dict(keyed_dropout=True), None),
}


def with_sample_ids(batches: list[list[dict]]) -> list[list[dict]]:
    """The batches with each item's id in the run's global sample order (what keyed dropout keys on)."""
    per_step = len(batches[0])
    return [[item | {SAMPLE_ID_KEY: torch.tensor(step * per_step + i)} for i, item in enumerate(items)]
            for step, items in enumerate(batches)]


def reference_key(variant: dict, layout: dict) -> tuple:
    return tuple(sorted(variant.items())), layout.get("keyed_dropout", False)


@pytest.mark.slow
def test_sequence_parallel_follows_one_process_and_tensor_parallelism(tmp_path):
    batches = with_sample_ids(make_batches(tmp_path))
    references = {}
    for variant, layout, _ in LAYOUTS.values():
        key = reference_key(variant, layout)
        if key not in references:
            references[key] = run_parallel_t5(variant, batches, keyed_dropout=layout.get("keyed_dropout", False))
    assert all(losses[-1] < losses[0] for losses in references.values()), "the references should learn"
    results = run_jobs(2, [(run_parallel_t5, (variant, batches), layout) for variant, layout, _ in LAYOUTS.values()],
                       tmp_path)
    by_name = dict(zip(LAYOUTS, results))
    for name, (variant, layout, also) in LAYOUTS.items():
        losses = by_name[name]
        reference = references[reference_key(variant, layout)]
        print(f"{name}: max |loss - single process| over {STEPS} steps = "
              f"{np.max(np.abs(np.subtract(losses, reference))):.2e}")
        assert len(losses) == STEPS
        np.testing.assert_allclose(losses, reference, atol=LOSS_TOLERANCE, rtol=0, err_msg=name)
        if also is not None:
            np.testing.assert_allclose(losses, by_name[also], atol=LOSS_TOLERANCE, rtol=0, err_msg=f"{name} vs {also}")


@pytest.mark.slow
def test_pipeline_stages_exchange_sequence_shards(tmp_path):
    """PP 2 x TP 2 with sequence parallelism (4 processes): stages send 1/tp of each sequence, and a stage
    rebuilds the whole-sequence position biases from it (the second stage ends the encoder, 3 + 1 layers)."""
    batches = make_batches(tmp_path)
    reference = run_parallel_t5(V1_0, batches, layers=(3, 1))
    [losses] = run_jobs(4, [(run_parallel_t5, (V1_0, batches), SEQUENCE_PARALLEL | dict(pp=2, layers=(3, 1)))],
                        tmp_path)
    np.testing.assert_allclose(losses, reference, atol=LOSS_TOLERANCE, rtol=0)


def test_keyed_dropout_changes_the_losses(tmp_path):
    """The keyed-dropout layout above is not vacuous: its masks change the single process's losses."""
    batches = with_sample_ids(make_batches(tmp_path))[:2]
    plain = run_parallel_t5(V1_0, batches)
    dropped = run_parallel_t5(V1_0_DROPOUT, batches, keyed_dropout=True)
    assert np.max(np.abs(np.subtract(plain, dropped))) > LOSS_TOLERANCE


@pytest.mark.parametrize("lengths, message", [
    ((32, 16), None),
    ((33, 16), r"^encoder_seq_length \(33\) is not divisible by tensor_model_parallel_size \(2\), which "
               r"sequence_parallel needs"),
    ((32, 15), r"^decoder_seq_length \(15\) is not divisible by tensor_model_parallel_size \(2\), which "
               r"sequence_parallel needs"),
])
def test_sequence_parallel_needs_both_lengths_divisible_by_tp(tmp_path, data_test, lengths, message):
    config = t5_config(str(tmp_path / "unused"), data_test, str(tmp_path), tensor_model_parallel_size=2,
                       sequence_parallel=True)
    t5 = dataclasses.replace(t5_settings(config), encoder_seq_length=lengths[0], decoder_seq_length=lengths[1])
    config = dataclasses.replace(config, families={**config.families, "t5": t5})
    if message is None:
        assert resolve_parallel_dims(config, 2, model_spec(config.model.model).layout_rules).tp == 2
        return
    with pytest.raises(TrainConfigError, match=message):
        resolve_parallel_dims(config, 2, model_spec(config.model.model).layout_rules)
