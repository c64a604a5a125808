"""Mixture of experts under tensor parallelism: the non-expert layers are tensor-parallel, each MoE layer's router
and experts are replicated over the tp ranks (Megatron's layout with expert-tensor-parallel size 1). A dropless
MoE GPT trained at TP 2 (with and without sequence parallelism, and with EP 2 on 4 ranks), a MoE T5 at TP 2,
and a MoE GPT at EP 2 x PP 2 follow the single-process loss curve, gradient norm (replicated expert gradients
counted once) and auxiliary metrics, in spawned gloo CPU processes."""

import dataclasses
import warnings

import pytest
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor
from trainer_testing import run_in_processes, t5_config, tiny_config

from trainer.config import MoEConfig
from trainer.models.gpt.model import GPT, GPTShape
from trainer.models.gpt.parallelize import apply_tp
from trainer.moe.layer import MoELayer
from trainer.moe.settings import MoESettings
from trainer.models import model_spec
from trainer.parallel.dims import resolve_parallel_dims

# The bar for dropless MoE in any layout: the loss curve within 1e-4 of one process's.
LOSS_ATOL = 1e-4
GRAD_NORM_RTOL = 1e-3
AUXILIARY_ATOL = 1e-5
MOE = MoEConfig(num_experts=4, moe_aux_loss_coeff=0.01, moe_z_loss_coeff=0.001)
TOP_KS = (1, 2)
MOE_SETTINGS = MoESettings(num_experts=4)


def moe_config(prefix, cache, top_k: int, ep: int = 1, **layout):
    config = tiny_config(prefix, cache, num_layers=2, **layout)
    return dataclasses.replace(config, moe=dataclasses.replace(MOE, moe_router_topk=top_k,
                                                               expert_model_parallel_size=ep))


@pytest.fixture(scope="module")
def single_process(tiny_prefix, cache_dir, workdir) -> dict[int, dict]:
    """Top-k -> the dropless run in one process."""
    runs = run_in_processes(1, [moe_config(tiny_prefix, cache_dir, k) for k in TOP_KS], workdir)
    return dict(zip(TOP_KS, runs))


def assert_follows(run: dict, reference: dict) -> None:
    assert len(run["losses"]) == len(reference["losses"]) == 10
    assert run["losses"] == pytest.approx(reference["losses"], abs=LOSS_ATOL)
    # Replicated expert gradients counted once per tp rank would raise the norm (and the clipping).
    assert run["grad_norms"] == pytest.approx(reference["grad_norms"], rel=GRAD_NORM_RTOL)
    for got, want in zip(run["auxiliary"], reference["auxiliary"]):
        assert got == pytest.approx(want, abs=AUXILIARY_ATOL)


def test_tp2_top1_and_top2_and_sequence_parallel_follow_the_single_process_curve(
        single_process, tiny_prefix, cache_dir, workdir):
    top1, top2, top2_sp = run_in_processes(2, [
        moe_config(tiny_prefix, cache_dir, 1, tp=2),
        moe_config(tiny_prefix, cache_dir, 2, tp=2),
        moe_config(tiny_prefix, cache_dir, 2, tp=2, sequence_parallel=True),
    ], workdir)
    assert single_process[2]["auxiliary"][0]["moe_dropped_fraction"] == 0.0  # dropless
    assert_follows(top1, single_process[1])
    assert_follows(top2, single_process[2])
    assert_follows(top2_sp, single_process[2])


def test_t5_with_experts_on_every_other_layer_at_tp2_follows_the_single_process_curve(
        sentence_prefix, data_test, cache_dir, workdir):
    """Dense and MoE MLPs side by side in both stacks: the dense ones tensor-parallel, the MoE ones whole."""
    moe = dataclasses.replace(MOE, moe_layer_freq=2)
    one, tp2 = (dataclasses.replace(t5_config(sentence_prefix, data_test, cache_dir, tensor_model_parallel_size=tp),
                                    moe=moe) for tp in (1, 2))
    assert_follows(run_in_processes(2, [tp2], workdir)[0], run_in_processes(1, [one], workdir)[0])


@pytest.mark.slow  # 4-rank run
def test_ep2_by_tp2_follows_the_single_process_curve(single_process, tiny_prefix, cache_dir, workdir):
    ep2_tp2 = run_in_processes(4, [moe_config(tiny_prefix, cache_dir, 2, ep=2, tp=2)], workdir)[0]
    assert_follows(ep2_tp2, single_process[2])


@pytest.mark.slow  # 4-rank runs
def test_ep2_by_pp2_follows_the_single_process_curve_with_both_schedules(
        single_process, tiny_prefix, cache_dir, workdir):
    """Each pipeline stage's ep peers run the same schedule, so their all-to-alls pair up micro-batch by
    micro-batch."""
    runs = run_in_processes(4, [moe_config(tiny_prefix, cache_dir, 2, ep=2, pp=2),
                                moe_config(tiny_prefix, cache_dir, 2, ep=2, pp=2, schedule="interleaved",
                                           virtual_layers=1)], workdir)
    for run in runs:
        assert_follows(run, single_process[2])


@pytest.mark.slow  # 4-rank runs
def test_a_checkpoint_saved_at_ep2_by_pp2_resumes_in_one_process_on_its_curve(
        single_process, tiny_prefix, cache_dir, workdir, tmp_path):
    half = len(single_process[2]["losses"]) // 2
    root = str(tmp_path / "ep2_pp2")
    run_in_processes(4, [moe_config(tiny_prefix, cache_dir, 2, ep=2, pp=2, train_iters=half, save=root)], workdir)
    resumed = run_in_processes(1, [moe_config(tiny_prefix, cache_dir, 2, load=root)], workdir)[0]
    assert resumed["losses"] == pytest.approx(single_process[2]["losses"][half:], abs=LOSS_ATOL)


def test_moe_with_tensor_and_pipeline_parallelism_and_fsdp_with_ep_passes_the_layout_rules(tiny_prefix, cache_dir):
    config = moe_config(tiny_prefix, cache_dir, 2, ep=2, tp=2)
    dims = resolve_parallel_dims(config, 4, model_spec(config.model.model).layout_rules)
    assert (dims.dp, dims.tp, dims.ep) == (2, 2, 2)
    config = moe_config(tiny_prefix, cache_dir, 2, ep=2, tp=2, pp=2)
    dims = resolve_parallel_dims(config, 8, model_spec(config.model.model).layout_rules)
    assert (dims.pp, dims.dp, dims.tp, dims.ep) == (2, 2, 2, 2)
    config = moe_config(tiny_prefix, cache_dir, 2, ep=2, tp=2)  # ZeRO-3: experts over expert_dp (test_moe_zero.py)
    config = dataclasses.replace(config, parallelism=dataclasses.replace(config.parallelism, zero_stage=3))
    dims = resolve_parallel_dims(config, 4, model_spec(config.model.model).layout_rules)
    assert (dims.dp, dims.tp, dims.ep) == (2, 2, 2)


@pytest.fixture
def single_rank_mesh(tmp_path):
    """A one-rank tp mesh over a one-process gloo group (its rendezvous file inside tmp_path)."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1)
    yield init_device_mesh("cpu", (1,), mesh_dim_names=("tp",))
    dist.destroy_process_group()


def test_the_gpt_plan_leaves_moe_layers_whole_without_a_warning(single_rank_mesh):
    shape = GPTShape(num_layers=2, hidden_size=16, num_attention_heads=2, ffn_hidden_size=32, padded_vocab_size=64,
                     max_position_embeddings=8, moe=MOE_SETTINGS)
    model = GPT(shape)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        apply_tp(model, single_rank_mesh, sequence_parallel=False)
    moe = [module for module in model.modules() if isinstance(module, MoELayer)]
    assert len(moe) == 2
    for layer in moe:
        assert not any(isinstance(p, DTensor) for p in layer.parameters())
    assert isinstance(model.layers["0"].attention.wo.weight, DTensor)
