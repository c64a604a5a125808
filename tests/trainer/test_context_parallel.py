"""Context parallelism (``--context-parallel-size``) in training: each sequence split over the cp ranks (Megatron's
load-balanced layout), keys and values all-gathered in attention. A run follows one process's losses, gradient
norms and valid/test losses within 1e-4 over 10 steps at sequence 1024 (2 blocks of width 32; GPT-2, and the
Llama-class shape: rotary positions, grouped-query attention); checkpoints do not depend on cp (saved at CP 2, resumed at CP 1);
layouts cp does not combine with, and the encoder families, are refused in one line.

By default CP 2 (GPT-2 and Llama-class; GPT-2 with activation recomputation, and with attention dropout recomputed
and not: the same losses) and CP 2 x TP 2 with sequence parallelism; ``pytest -m campaign`` adds
CP 4, CP 2 x DP 2 (FSDP2), CP 2 x PP 2, CP 2 x TP 2 without sequence parallelism (each GPT-2 and Llama-class) and
CP 2 at ZeRO 1 and 3, and a checkpoint saved at CP 4 resumed at CP 2 and at TP 2.
"""

from __future__ import annotations

import dataclasses

import pytest
from test_llama_parity import TOLERANCE, assert_follows, llama_config, with_parallelism, with_switches
from trainer_testing import result_record, run_in_processes, tiny_config

from trainer.config import TrainConfig

# The sequence: long enough that each rank's two chunks (256 tokens at CP 2) are a real split.
SEQ_LENGTH = 1024
HALF_STEPS = 5
# Two blocks keep a 1024-token run fast on a CPU; every block's attention goes through the same gather.
NUM_LAYERS = 2
ATTENTION_DROPOUT = 0.1
# The least change of some loss that shows the dropout masks were drawn (runs repeat to the bit without them).
DROPOUT_MOVES_LOSSES = 1e-6


def long_sequence(config: TrainConfig, cp: int = 1, **parallelism) -> TrainConfig:
    """``config`` at sequence SEQ_LENGTH and context-parallel size ``cp`` (plus other parallelism fields)."""
    model = dataclasses.replace(config.model, seq_length=SEQ_LENGTH, max_position_embeddings=SEQ_LENGTH)
    return with_parallelism(dataclasses.replace(config, model=model), context_parallel_size=cp, **parallelism)


def gpt2(prefix: str, cache: str, cp: int = 1, zero_stage: int = 0, **layout) -> TrainConfig:
    return long_sequence(tiny_config(prefix, cache, eval_iters=1, num_layers=NUM_LAYERS, **layout), cp,
                         zero_stage=zero_stage)


def llama(prefix: str, cache: str, cp: int = 1, zero_stage: int = 0, **layout) -> TrainConfig:
    return long_sequence(llama_config(prefix, cache, num_layers=NUM_LAYERS, **layout), cp, zero_stage=zero_stage)


@pytest.fixture(scope="module")
def references(tiny_prefix, cache_dir) -> dict:
    return {"gpt2": result_record(gpt2(tiny_prefix, cache_dir)), "llama": result_record(llama(tiny_prefix, cache_dir))}


def with_attention_dropout(config: TrainConfig) -> TrainConfig:
    return dataclasses.replace(config, model=dataclasses.replace(config.model, attention_dropout=ATTENTION_DROPOUT))


@pytest.fixture(scope="module")
def two_process(tiny_prefix, cache_dir, workdir) -> dict:
    cp2 = gpt2(tiny_prefix, cache_dir, cp=2)
    configs = {"gpt2": cp2, "llama": llama(tiny_prefix, cache_dir, cp=2),
               "gpt2_recompute": with_switches(cp2, checkpoint_activations=True),
               "gpt2_dropout": with_attention_dropout(cp2),
               "gpt2_dropout_recompute": with_attention_dropout(with_switches(cp2, checkpoint_activations=True))}
    return dict(zip(configs, run_in_processes(2, list(configs.values()), workdir)))


@pytest.mark.timeout(900)
def test_the_long_sequence_references_learn(references):
    for result in references.values():
        assert len(result["losses"]) == 10
        assert result["losses"][-1] < result["losses"][0] - 0.1


@pytest.mark.timeout(900)
@pytest.mark.parametrize("model", ["gpt2", "llama"])
def test_cp2_follows_one_process(model, two_process, references):
    assert_follows(two_process[model], references[model])


@pytest.mark.timeout(900)
def test_cp2_with_activation_recomputation_follows_one_process(two_process, references):
    assert_follows(two_process["gpt2_recompute"], references["gpt2"])


@pytest.mark.timeout(900)
def test_recomputed_layers_draw_the_attention_dropout_masks_of_their_forward(two_process):
    # The checkpointed block's forward runs twice and the attention's backward runs its blocks again: every
    # run draws the forward's masks, so recomputation changes nothing.
    assert_follows(two_process["gpt2_dropout_recompute"], two_process["gpt2_dropout"])
    # Dropout is on: the losses move (a few 1e-5 at probability 0.1 on this tiny model's near-uniform attention;
    # the same run without it repeats to the bit).
    moved = max(abs(a - b) for a, b in zip(two_process["gpt2_dropout"]["losses"], two_process["gpt2"]["losses"]))
    assert moved > DROPOUT_MOVES_LOSSES


@pytest.mark.timeout(900)
def test_cp2_tp2_sequence_parallel_follows_one_process(tiny_prefix, cache_dir, workdir, references):
    config = gpt2(tiny_prefix, cache_dir, cp=2, tp=2, sequence_parallel=True)
    assert_follows(run_in_processes(4, [config], workdir)[0], references["gpt2"])


@pytest.mark.timeout(900)
def test_a_checkpoint_saved_at_cp2_resumes_at_cp1(tiny_prefix, cache_dir, workdir, references, tmp_path):
    save = str(tmp_path / "cp2")
    first = run_in_processes(2, [gpt2(tiny_prefix, cache_dir, cp=2, train_iters=HALF_STEPS, save=save)], workdir)[0]
    resumed = result_record(gpt2(tiny_prefix, cache_dir, load=save))
    reference = references["gpt2"]
    assert first["losses"] == pytest.approx(reference["losses"][:HALF_STEPS], abs=TOLERANCE)
    assert resumed["losses"] == pytest.approx(reference["losses"][HALF_STEPS:], abs=TOLERANCE)
    assert resumed["grad_norms"] == pytest.approx(reference["grad_norms"][HALF_STEPS:], abs=TOLERANCE)


# -- the wider grid (pytest -m campaign) -------------------------------------------------------------------------
CAMPAIGN_TWO_PROCESS = {"cp2_zero1": {"zero_stage": 1}, "cp2_fsdp": {"zero_stage": 3}}
CAMPAIGN_FOUR_PROCESS = {"cp4": {"cp": 4}, "cp2_dp2_fsdp": {"cp": 2, "zero_stage": 3}, "cp2_pp2": {"cp": 2, "pp": 2},
                         "cp2_tp2": {"cp": 2, "tp": 2}}


@pytest.mark.campaign
@pytest.mark.timeout(3600)
def test_campaign_cp_layouts_follow_one_process(tiny_prefix, cache_dir, workdir, references):
    two = {("gpt2", name): gpt2(tiny_prefix, cache_dir, cp=2, **layout) for name, layout in CAMPAIGN_TWO_PROCESS.items()}
    four = {(model, name): build(tiny_prefix, cache_dir, **layout)
            for model, build in (("gpt2", gpt2), ("llama", llama)) for name, layout in CAMPAIGN_FOUR_PROCESS.items()}
    results = dict(zip(two, run_in_processes(2, list(two.values()), workdir)))
    results |= dict(zip(four, run_in_processes(4, list(four.values()), workdir)))
    for (model, name), result in results.items():
        assert_follows(result, references[model], f"{model} {name}")


@pytest.mark.campaign
@pytest.mark.timeout(3600)
def test_campaign_a_checkpoint_saved_at_cp4_resumes_at_cp2_and_at_tp2(tiny_prefix, cache_dir, workdir, references,
                                                                       tmp_path):
    save = str(tmp_path / "cp4")
    first = run_in_processes(4, [gpt2(tiny_prefix, cache_dir, cp=4, train_iters=HALF_STEPS, save=save)], workdir)[0]
    resumed = run_in_processes(2, [gpt2(tiny_prefix, cache_dir, cp=2, load=save),
                                   gpt2(tiny_prefix, cache_dir, tp=2, load=save)], workdir)
    reference = references["gpt2"]
    assert first["losses"] == pytest.approx(reference["losses"][:HALF_STEPS], abs=TOLERANCE)
    for result in resumed:
        assert result["losses"] == pytest.approx(reference["losses"][HALF_STEPS:], abs=TOLERANCE)
        assert result["grad_norms"] == pytest.approx(reference["grad_norms"][HALF_STEPS:], abs=TOLERANCE)
