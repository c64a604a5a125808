"""``train --num-experts N --compile``: a MoE block compiles its static parts (attention, norms, dropout, the
router) and keeps the token dispatch and the grouped expert products eager; dense blocks compile whole. A
compiled tiny MoE GPT and T5 train like the eager ones, within the dense compile tests' `COMPILE_RTOL`
(2e-5 relative: inductor's fused norms, softmax and GELU reorder float sums by a few ulps, and AdamW turns
ulp-sized gradient differences into lr-sized weight differences; a part left out or a wrong graph moves the
loss by percents). The router's top-k then still picks the same experts: the same tokens are dropped."""

import dataclasses

import pytest
import torch
from test_compile_and_kernels import assert_same_losses, compiled, fresh_compiler, short_run  # noqa: F401
from trainer_testing import result_record, t5_config, tiny_config

from trainer.config import MoEConfig, ParallelismConfig
from trainer.models.gpt.model import GPTShape
from trainer.models.gpt.spec import PLAN as GPT_PLAN
from trainer.moe.settings import MoESettings
from trainer.parallel.dims import ParallelDims
from trainer.parallel.runner import ParallelModel


def with_experts(config, **moe):
    return dataclasses.replace(config, moe=MoEConfig(num_experts=4, **moe))


def is_compiled(module: torch.nn.Module) -> bool:
    """Whether `apply_compile` replaced the module's forward (torch.compile is lazy: nothing ran yet)."""
    return "forward" in vars(module)


def test_a_moe_block_compiles_its_static_parts_and_keeps_the_dispatch_eager():
    shape = GPTShape(num_layers=2, hidden_size=32, num_attention_heads=2, ffn_hidden_size=64,
                     max_position_embeddings=8, padded_vocab_size=64, moe=MoESettings(num_experts=4, layer_freq=2))
    dims = ParallelDims(pp=1, dp=1, tp=1, micro_batch_size=1, num_microbatches=1)
    model = ParallelModel(GPT_PLAN, shape, dims, None, ParallelismConfig(), torch.device("cpu"), 0, False, None,
                          compile_blocks=True).parts[0]
    moe_block, dense_block = model.layers["0"], model.layers["1"]
    assert is_compiled(dense_block)  # no MoE inside: the whole block, as before
    assert not is_compiled(moe_block)
    assert all(is_compiled(part) for part in (moe_block.attention_norm, moe_block.attention, moe_block.ffn_norm,
                                              moe_block.dropout, moe_block.feed_forward.router))
    assert not is_compiled(moe_block.feed_forward) and not is_compiled(moe_block.feed_forward.experts)


@pytest.mark.timeout(600)
def test_compiled_moe_gpt_trains_like_eager(tiny_prefix, cache_dir, fresh_compiler):
    # Top-2 with a capacity factor and both auxiliary losses: every eager piece of the layer takes part.
    config = with_experts(short_run(tiny_config(tiny_prefix, cache_dir)), moe_router_topk=2,
                          moe_expert_capacity_factor=1.0, moe_aux_loss_coeff=0.01, moe_z_loss_coeff=0.001)
    graphs = torch._dynamo.utils.counters["stats"]
    eager, graphs_before = result_record(config), graphs["unique_graphs"]
    compiled_result = result_record(compiled(config))
    assert graphs["unique_graphs"] > graphs_before  # the static parts ran compiled
    assert_same_losses(compiled_result, eager)
    assert [step["moe_dropped_fraction"] for step in compiled_result["auxiliary"]] == \
        [step["moe_dropped_fraction"] for step in eager["auxiliary"]]  # the same routing, the same drops


@pytest.mark.campaign  # 27 s; the MoE GPT above compiles the same expert block by default
@pytest.mark.timeout(600)
def test_compiled_switch_t5_trains_like_eager(sentence_prefix, data_test, tmp_path, fresh_compiler):
    config = with_experts(short_run(t5_config(sentence_prefix, data_test, str(tmp_path / "cache"))),
                          moe_router_topk=1, moe_router_pre_softmax=True, moe_aux_loss_coeff=0.01)
    assert_same_losses(result_record(compiled(config)), result_record(config))
