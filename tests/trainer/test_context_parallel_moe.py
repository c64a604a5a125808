"""Mixture of experts under context parallelism (Megatron's layout): each cp rank routes its own share of every
sequence through the experts; with expert parallelism the ep groups are drawn from the dp x cp ranks (ep up to
dp x cp, expert_dp = dp x cp / ep); the load-balancing and z-loss statistics are the whole sequence's (tokens
per expert summed over the cp ranks). A dropless MoE GPT (2 layers, 4 experts, top-2, sequence 128) follows one
process within 1e-5 over 4 steps: losses, gradient norms, valid/test losses and every auxiliary metric (aux and
z-loss, expert loads), for both load-balancing kinds, at CP 2, CP 2 x EP 2 (the ep group is the cp pair), and a
checkpoint saved at CP 2 x EP 2 resumes in one process on the curve. ``pytest -m campaign`` adds the 4-process
CP 2 x DP 2 with EP 2 (ZeRO 0, 1 and 3) and EP 4 and CP 2 x TP 2 with sequence parallelism (run by hand: within 1e-5).
"""

from __future__ import annotations

import dataclasses

import pytest
from test_llama_parity import with_parallelism
from trainer_testing import result_record, run_in_processes, tiny_config

from trainer.config import MoEConfig, TrainConfig

# The bar: every per-step figure within 1e-5 of one process's.
TOLERANCE = 1e-5
SEQ_LENGTH = 128
STEPS = 4
HALF_STEPS = STEPS // 2
MOE = MoEConfig(num_experts=4, moe_router_topk=2, moe_aux_loss_coeff=0.01, moe_z_loss_coeff=0.001)


def moe_gpt(prefix: str, cache: str, cp: int = 1, ep: int = 1, load_balancing: str = "aux_loss",
            **layout) -> TrainConfig:
    """The tiny MoE GPT at sequence SEQ_LENGTH, context-parallel size ``cp``, expert-parallel size ``ep``."""
    parallelism = {key: layout.pop(key) for key in ("zero_stage",) if key in layout}
    config = tiny_config(prefix, cache, num_layers=2, eval_iters=1, train_iters=layout.pop("train_iters", STEPS),
                         **layout)
    model = dataclasses.replace(config.model, seq_length=SEQ_LENGTH, max_position_embeddings=SEQ_LENGTH)
    moe = dataclasses.replace(MOE, expert_model_parallel_size=ep, moe_router_load_balancing_type=load_balancing)
    return with_parallelism(dataclasses.replace(config, model=model, moe=moe), context_parallel_size=cp, **parallelism)


def assert_follows(result: dict, reference: dict, steps: slice = slice(None)) -> None:
    """Losses, gradient norms and auxiliary metrics of every step (of ``steps`` of the reference), and the
    valid/test losses at the end (of a run that ends with the reference), within `TOLERANCE`."""
    assert len(result["losses"]) == len(reference["losses"][steps])
    assert result["losses"] == pytest.approx(reference["losses"][steps], abs=TOLERANCE)
    assert result["grad_norms"] == pytest.approx(reference["grad_norms"][steps], abs=TOLERANCE)
    for got, want in zip(result["auxiliary"], reference["auxiliary"][steps], strict=True):
        assert got == pytest.approx(want, abs=TOLERANCE)
    if steps.stop is None:
        assert result["eval_losses"] == pytest.approx(reference["eval_losses"], abs=TOLERANCE)


@pytest.fixture(scope="module")
def references(tiny_prefix, cache_dir) -> dict[str, dict]:
    return {kind: result_record(moe_gpt(tiny_prefix, cache_dir, load_balancing=kind))
            for kind in ("aux_loss", "seq_aux_loss")}


def test_the_reference_reports_the_auxiliary_losses_and_learns(references):
    for result in references.values():
        assert result["losses"][-1] < result["losses"][0]
        assert all(step["moe_aux_loss"] > 0 and step["moe_z_loss"] > 0 for step in result["auxiliary"])


@pytest.mark.timeout(600)
def test_cp2_and_cp2_ep2_follow_one_process(tiny_prefix, cache_dir, workdir, references, tmp_path):
    save = str(tmp_path / "cp2_ep2")
    configs = [moe_gpt(tiny_prefix, cache_dir, cp=2),
               moe_gpt(tiny_prefix, cache_dir, cp=2, load_balancing="seq_aux_loss"),
               moe_gpt(tiny_prefix, cache_dir, cp=2, ep=2),
               moe_gpt(tiny_prefix, cache_dir, cp=2, ep=2, train_iters=HALF_STEPS, save=save)]
    cp2, cp2_sequence, cp2_ep2, first_half = run_in_processes(2, configs, workdir)
    assert_follows(cp2, references["aux_loss"])
    assert_follows(cp2_sequence, references["seq_aux_loss"])
    assert_follows(cp2_ep2, references["aux_loss"])
    assert_follows(first_half, references["aux_loss"], slice(HALF_STEPS))
    resumed = result_record(moe_gpt(tiny_prefix, cache_dir, load=save))
    assert_follows(resumed, references["aux_loss"], slice(HALF_STEPS, None))


CAMPAIGN_FOUR_PROCESS = {"cp2_dp2_ep2": {"cp": 2, "ep": 2}, "cp2_dp2_ep4": {"cp": 2, "ep": 4},
                         "cp2_dp2_ep2_zero1": {"cp": 2, "ep": 2, "distributed_optimizer": True},
                         "cp2_dp2_ep2_fsdp": {"cp": 2, "ep": 2, "zero_stage": 3},
                         "cp2_tp2_sequence_parallel": {"cp": 2, "tp": 2, "sequence_parallel": True}}


@pytest.mark.campaign
@pytest.mark.timeout(1800)
def test_campaign_four_process_layouts_follow_one_process(tiny_prefix, cache_dir, workdir, references):
    configs = {name: moe_gpt(tiny_prefix, cache_dir, **layout) for name, layout in CAMPAIGN_FOUR_PROCESS.items()}
    for name, result in zip(configs, run_in_processes(4, list(configs.values()), workdir)):
        gap = max(abs(a - b) for a, b in zip(result["losses"], references["aux_loss"]["losses"]))
        print(f"{name}: largest loss gap to one process {gap:.2e}")
        assert_follows(result, references["aux_loss"])
