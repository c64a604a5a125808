"""A Llama-class decoder follows the single-process loss curve in every parallel layout.

The tiny model of the parity tests (4 layers, width 32, 4 heads, seq 32, fp32, no dropout, 10 steps) with every
Llama-class option on at once: RMSNorm with zero-centred weights, SwiGLU, rotary embeddings with Llama 3.1's
frequency scaling and half the channels rotated, grouped-query attention (2 key/value groups of 16 channels,
kv_channels different from hidden/heads), no linear biases but q/k/v biases, q/k norms, an untied head.
Each layout's per-step losses and gradient norms and its final valid/test losses are those of one process
within 1e-4; with experts (Mixtral's routing: softmax over all experts, top 2, renormalised, which is
Megatron's default top-k-then-softmax) too. A checkpoint saved in one layout resumes in another (one process,
unfused) on the straight run's curve.

By default a few spawned two-process layouts and the single-process switches (recompute, fused q/k/v); the
exhaustive grid (every schedule, ZeRO stage, compile, keyed dropout, four-process combinations) runs with
``pytest -m campaign``.
"""

from __future__ import annotations

import dataclasses

import pytest
from trainer_testing import result_record, run_in_processes, tiny_config

from trainer.config import ModelConfig, MoEConfig, TrainConfig

TOLERANCE = 1e-4
EXPERTS = 4
DROPOUT = 0.1


def llama_config(prefix: str, cache: str, *, experts: bool = False, ep: int = 1, dropout: float = 0.0,
                 fused_qkv: bool = False, **layout) -> TrainConfig:
    """`tiny_config` with the Llama-class options (and a Mixtral-style MoE MLP when ``experts``)."""
    config = tiny_config(prefix, cache, eval_iters=1, **layout)
    base = config.model
    model = ModelConfig(num_layers=base.num_layers, hidden_size=base.hidden_size,
                        num_attention_heads=base.num_attention_heads, seq_length=base.seq_length,
                        vocab_size=base.vocab_size, make_vocab_size_divisible_by=base.make_vocab_size_divisible_by,
                        hidden_dropout=dropout, attention_dropout=dropout, normalization="RMSNorm",
                        apply_layernorm_1p=True, swiglu=True, ffn_hidden_size=48, position_embedding_type="rope",
                        rotary_base=500000, rotary_percent=0.5, use_rope_scaling=True, rope_scaling_factor=8.0,
                        group_query_attention=True, num_query_groups=2, disable_bias_linear=True,
                        add_qkv_bias=True, qk_layernorm=True, fused_qkv=fused_qkv, kv_channels=16,
                        untie_embeddings_and_output_weights=True)
    moe = MoEConfig(num_experts=EXPERTS, moe_router_topk=2, expert_model_parallel_size=ep) if experts else MoEConfig()
    return dataclasses.replace(config, model=model, moe=moe)


def with_switches(config: TrainConfig, **training) -> TrainConfig:
    return dataclasses.replace(config, training=dataclasses.replace(config.training, **training))


def with_parallelism(config: TrainConfig, **parallelism) -> TrainConfig:
    return dataclasses.replace(config, parallelism=dataclasses.replace(config.parallelism, **parallelism))


def assert_follows(result: dict, reference: dict, name: str = "") -> None:
    """Every per-step loss and gradient norm and the final valid/test losses within `TOLERANCE`; the largest
    gap is printed (``pytest -s`` shows the measured figures)."""
    pairs = [*zip(result["losses"], reference["losses"]), *zip(result["grad_norms"], reference["grad_norms"]),
             *((loss, reference["eval_losses"][split]) for split, loss in result["eval_losses"].items())]
    print(f"{name}: largest gap to one process {max(abs(a - b) for a, b in pairs):.2e}")
    assert len(result["losses"]) == len(reference["losses"])
    for step, (got, want) in enumerate(zip(result["losses"], reference["losses"]), start=1):
        assert got == pytest.approx(want, abs=TOLERANCE), f"loss of step {step}"
    for step, (got, want) in enumerate(zip(result["grad_norms"], reference["grad_norms"]), start=1):
        assert got == pytest.approx(want, abs=TOLERANCE), f"grad norm of step {step}"
    for split, loss in result["eval_losses"].items():
        assert loss == pytest.approx(reference["eval_losses"][split], abs=TOLERANCE), f"{split} loss"


# -- the default grid ------------------------------------------------------------------------------------------
# (name, two-process layout, experts)
TWO_PROCESS = {
    "tp2_sequence_parallel": ({"tp": 2, "sequence_parallel": True}, False),
    "pp2_1f1b": ({"pp": 2}, False),
    "dp2_fsdp": ({"distributed_optimizer": True}, False),
    "moe_ep2": ({"ep": 2}, True),
}
SINGLE_PROCESS = {
    "recompute": lambda c: with_switches(c, checkpoint_activations=True),
    "fused_qkv": lambda c: dataclasses.replace(c, model=dataclasses.replace(c.model, fused_qkv=True)),
}


@pytest.fixture(scope="module")
def references(tiny_prefix, cache_dir) -> dict:
    """One process: the dense and the MoE Llama."""
    return {experts: result_record(llama_config(tiny_prefix, cache_dir, experts=experts)) for experts in (False, True)}


@pytest.fixture(scope="module")
def two_process_results(tiny_prefix, cache_dir, workdir) -> dict:
    configs = [llama_config(tiny_prefix, cache_dir, experts=experts, **layout)
               for layout, experts in TWO_PROCESS.values()]
    return dict(zip(TWO_PROCESS, run_in_processes(2, configs, workdir)))


def test_the_llama_reference_learns(references):
    for result in references.values():
        assert len(result["losses"]) == 10
        assert result["losses"][-1] < result["losses"][0] - 0.1


@pytest.mark.timeout(900)
@pytest.mark.parametrize("layout", list(TWO_PROCESS))
def test_two_process_layout_follows_single_process(layout, two_process_results, references):
    assert_follows(two_process_results[layout], references[TWO_PROCESS[layout][1]], layout)


@pytest.mark.parametrize("switch", list(SINGLE_PROCESS))
def test_single_process_switch_follows(switch, tiny_prefix, cache_dir, references):
    config = SINGLE_PROCESS[switch](llama_config(tiny_prefix, cache_dir))
    assert_follows(result_record(config), references[False], switch)


# -- checkpoints reshard ----------------------------------------------------------------------------------------
HALF = 5
# first half's layout (saved) -> resumed in one process: (two-process layout, experts, fused q/k/v)
RESHARDS = {"tp2_sequence_parallel_fused_qkv": ({"tp": 2, "sequence_parallel": True}, False, True),
            "moe_ep2": ({"ep": 2}, True, False)}


@pytest.mark.timeout(900)
def test_checkpoints_reshard_into_one_process(tiny_prefix, cache_dir, workdir, references):
    """A first half saved under tensor (fused q/k/v: groups per rank) or expert parallelism, resumed in one
    unfused process, gives the straight single-process run's second half."""
    saves = {name: str(workdir / f"llama_reshard_{name}") for name in RESHARDS}
    firsts = [llama_config(tiny_prefix, cache_dir, experts=experts, fused_qkv=fused, train_iters=HALF,
                           save=saves[name], **layout) for name, (layout, experts, fused) in RESHARDS.items()]
    run_in_processes(2, firsts, workdir)
    for name, (_, experts, _) in RESHARDS.items():
        resumed = result_record(llama_config(tiny_prefix, cache_dir, experts=experts, load=saves[name]))
        reference = references[experts]
        second = {"losses": reference["losses"][HALF:], "grad_norms": reference["grad_norms"][HALF:],
                  "eval_losses": reference["eval_losses"]}
        assert_follows(resumed, second, f"resumed from {name}")


# -- the exhaustive grid (pytest -m campaign) -----------------------------------------------------------------
CAMPAIGN_TWO_PROCESS = {
    "tp2": ({"tp": 2}, False),
    "pp2_gpipe": ({"pp": 2, "schedule": "gpipe"}, False),
    "pp2_interleaved": ({"pp": 2, "schedule": "interleaved", "virtual_layers": 1}, False),
    "dp2_ddp": ({}, False),
    "moe_tp2": ({"tp": 2}, True),
    "moe_dp2": ({}, True),
}
ZERO_STAGES = (1, 2, 3)
CAMPAIGN_FOUR_PROCESS = {
    "dp2_tp2": ({"tp": 2}, False),
    "pp2_tp2_sequence_parallel": ({"pp": 2, "tp": 2, "sequence_parallel": True}, False),
    "dp2_pp2": ({"pp": 2}, False),
    "moe_ep2_tp2": ({"tp": 2, "ep": 2}, True),
}


@pytest.mark.campaign
@pytest.mark.timeout(3600)
def test_campaign_every_layout_follows_single_process(tiny_prefix, cache_dir, workdir, references):
    configs = {name: llama_config(tiny_prefix, cache_dir, experts=experts, **layout)
               for name, (layout, experts) in CAMPAIGN_TWO_PROCESS.items()}
    for stage in ZERO_STAGES:
        base = llama_config(tiny_prefix, cache_dir)
        configs[f"zero{stage}"] = with_parallelism(base, zero_stage=stage)
    results = dict(zip(configs, run_in_processes(2, list(configs.values()), workdir)))
    four = {name: llama_config(tiny_prefix, cache_dir, experts=experts, **layout)
            for name, (layout, experts) in CAMPAIGN_FOUR_PROCESS.items()}
    results |= dict(zip(four, run_in_processes(4, list(four.values()), workdir)))
    experts_of = {**{n: e for n, (_, e) in CAMPAIGN_TWO_PROCESS.items()},
                  **{n: e for n, (_, e) in CAMPAIGN_FOUR_PROCESS.items()}}
    for name, result in results.items():
        assert_follows(result, references[experts_of.get(name, False)], name)
    compiled = result_record(with_switches(llama_config(tiny_prefix, cache_dir), compile=True))
    assert_follows(compiled, references[False], "compile")


@pytest.mark.campaign
@pytest.mark.timeout(1800)
def test_campaign_keyed_dropout_layouts_follow_single_process(tiny_prefix, cache_dir, workdir):
    """With dropout on, keyed dropout draws the same masks in every layout (`trainer.parallel.keyed_dropout`)."""
    keyed = lambda **layout: with_parallelism(  # noqa: E731
        llama_config(tiny_prefix, cache_dir, dropout=DROPOUT, **layout), keyed_dropout=True)
    reference = result_record(keyed())
    layouts = {"tp2_sequence_parallel": {"tp": 2, "sequence_parallel": True}, "pp2": {"pp": 2}, "dp2": {}}
    results = run_in_processes(2, [keyed(**layout) for layout in layouts.values()], workdir)
    for name, result in zip(layouts, results):
        assert_follows(result, reference, f"keyed dropout {name}")
