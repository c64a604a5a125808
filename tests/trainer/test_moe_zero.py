"""Mixture of experts with expert parallelism at ZeRO stages 2-3 (FSDP2): each MoE layer's experts form an
FSDP2 unit of their own over ``expert_dp`` (`trainer.moe.parallel.apply_expert_fsdp`), the blocks and the
root are sharded over ``dp``. A dropless MoE GPT at EP 2 on 4 ranks (expert_dp 2) follows one process's and
stage 0's loss curve and gradient norm within 1e-5 in fp32 at stages 2 and 3, with CPU offload, at EP 4
(expert_dp 1), at EP 2 x TP 2, and with fewer local experts than expert_dp ranks (and accumulation); the
README's DeepSpeed "T5 FP16 + MoE + ZeRO-2" example runs at tiny size and follows its stage 0; a checkpoint
saved at EP 2 stage 3 resumes at EP 1 stage 0 and at EP 2 stage 1 on the same curve; ``--print-memory``
counts a quarter of every tensor per rank. In spawned gloo CPU processes, several runs per launch.
"""

import dataclasses
import math
import re
import shlex
from pathlib import Path

import pytest
import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.tensor import Shard
from trainer_testing import run_in_processes, t5_config, tiny_config

from trainer.checkpoint.store import checkpoint_dir
from trainer.cli.train_args import build_parser, config_from_args
from trainer.config import MoEConfig, PrecisionConfig
from trainer.metrics.records import read_run
from trainer.moe.parallel import expert_shard_placement
from trainer.models import model_spec
from trainer.parallel.dims import resolve_parallel_dims

# fp32: the stages sum the same gradients in another order (reduce-scatter or all-reduce, over expert_dp or
# dp), so the losses differ by float rounding only; a wrong divide factor or a missed reduction of the expert
# gradients moves them by 1e-4 and more (measured: dividing twice at EP 4 shifted step 8's loss by 8e-5).
LOSS_ATOL = 1e-5
# bf16 autocast casts fp32 weights that differ by such roundings, and a cast that rounds the other way moves
# the loss by far more than fp32 would (measured: 1.6e-4 between EP 2 stages 2 and 0 over 10 steps).
BF16_LOSS_ATOL = 1e-3
STEPS, HALF = 10, 5
WORLD = 4
FP32_BYTES = 4
# AdamW's two moments per element, and its float32 ``step`` scalar per tensor.
MOMENTS, STEP_BYTES = 2, 4
MOE = MoEConfig(num_experts=4, moe_router_topk=2, moe_aux_loss_coeff=0.01, moe_z_loss_coeff=0.001)
BF16 = PrecisionConfig(bf16=True)
# The example lives in the MoE page of the documentation (moved there from README.md).
README = Path(__file__).resolve().parents[2] / "docs" / "moe.md"
README_EXAMPLE = "# DeepSpeed's \"T5 (FP16 + MoE + ZeRO stage 2)\""


def moe_config(prefix, cache, ep: int = 1, stage: int = 0, offload: bool = False, num_experts: int = 4, **overrides):
    """The tiny dropless MoE GPT (2 layers, hidden 16, seq 32, global batch 8) at ``ep`` and ZeRO ``stage``."""
    config = tiny_config(prefix, cache, num_layers=2, hidden_size=16, **overrides)
    return dataclasses.replace(
        config, moe=dataclasses.replace(MOE, num_experts=num_experts, expert_model_parallel_size=ep),
        parallelism=dataclasses.replace(config.parallelism, zero_stage=stage, cpu_offload=offload))


def readme_example_config():
    """The `train` command under README_EXAMPLE, parsed as `train` parses it."""
    text = README.read_text(encoding="utf-8")
    after = text[text.index(README_EXAMPLE):]
    command = re.search(r"^train .*?[^\\]$", after, re.M | re.S).group(0).replace("\\\n", " ")
    return config_from_args(build_parser().parse_args(shlex.split(command)[1:]))


def t5_example(prefix, data_test, cache, stage: int):
    """The README example's experts, precision and ZeRO stage on the tiny T5 (2+2 layers, width 32), at
    its expert-parallel size over 4 ranks (micro-batch 1: global batch 4 over DP 4), ZeRO ``stage``."""
    example = readme_example_config()
    config = t5_config(prefix, data_test, cache)
    return dataclasses.replace(
        config, moe=example.moe, precision=example.precision,
        training=dataclasses.replace(config.training, micro_batch_size=1),
        parallelism=dataclasses.replace(config.parallelism, zero_stage=stage,
                                        cpu_offload=example.parallelism.cpu_offload))


def assert_follows(run: dict, reference: dict, label: str) -> None:
    assert len(run["losses"]) == len(reference["losses"]), label
    assert run["losses"] == pytest.approx(reference["losses"], abs=LOSS_ATOL), label
    assert run["grad_norms"] == pytest.approx(reference["grad_norms"], abs=LOSS_ATOL), label
    assert run["eval_losses"] == pytest.approx(reference["eval_losses"], abs=LOSS_ATOL), label
    for got, want in zip(run["auxiliary"], reference["auxiliary"]):
        assert got == pytest.approx(want, abs=LOSS_ATOL), label


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("moe_zero") / "ep2_stage3")


@pytest.fixture(scope="module")
def saved_metrics(saved) -> str:
    return str(Path(saved).parent / "ep2_stage3.jsonl")


@pytest.fixture(scope="module")
def four_ranks(tiny_prefix, sentence_prefix, data_test, cache_dir, workdir, saved, saved_metrics) -> dict[str, dict]:
    """Every 4-rank run, in one launch (label -> result); "save" writes the checkpoint of step HALF and the
    memory after step 1."""
    gpt = dict(prefix=tiny_prefix, cache=cache_dir)
    save = moe_config(**gpt, ep=2, stage=3, train_iters=HALF, save=saved, metrics_file=saved_metrics)
    layouts = {
        "ep2 stage0": moe_config(**gpt, ep=2, stage=0),
        "ep2 stage2": moe_config(**gpt, ep=2, stage=2),
        "ep2 stage3": moe_config(**gpt, ep=2, stage=3),
        "ep2 stage2 offload": moe_config(**gpt, ep=2, stage=2, offload=True),
        "ep4 stage3": moe_config(**gpt, ep=4, stage=3),  # expert_dp 1: no reduce-scatter, the factor alone
        "ep2 tp2 stage3": moe_config(**gpt, ep=2, stage=3, tp=2),  # experts replicated over tp, in their units
        "ep2 stage0 bf16": dataclasses.replace(moe_config(**gpt, ep=2, stage=0), precision=BF16),
        "ep2 stage3 bf16": dataclasses.replace(moe_config(**gpt, ep=2, stage=3), precision=BF16),
        # One local expert for two expert_dp ranks: FSDP2 shards the experts' hidden dimension instead;
        # with two accumulated micro-batches per step (the expert units skip the reduction of the first).
        "2 experts ep2 stage0": moe_config(**gpt, ep=2, stage=0, num_experts=2, micro_batch_size=1),
        "2 experts ep2 stage3": moe_config(**gpt, ep=2, stage=3, num_experts=2, micro_batch_size=1),
        "save": dataclasses.replace(save, logging=dataclasses.replace(save.logging, print_memory=True)),
        "t5 stage0": t5_example(sentence_prefix, data_test, cache_dir, 0),
        "t5 example": t5_example(sentence_prefix, data_test, cache_dir, readme_example_config().parallelism.zero_stage),
    }
    return dict(zip(layouts, run_in_processes(WORLD, list(layouts.values()), workdir)))


@pytest.fixture(scope="module")
def one_process(tiny_prefix, cache_dir, workdir, four_ranks, saved) -> dict[str, dict]:
    """The single-process reference and the EP 1 stage 0 resume of the EP 2 stage 3 checkpoint."""
    reference, resumed = run_in_processes(1, [moe_config(tiny_prefix, cache_dir),
                                              moe_config(tiny_prefix, cache_dir, load=saved)], workdir)
    return {"reference": reference, "resumed": resumed}


@pytest.mark.slow  # 4-rank runs
@pytest.mark.timeout(900)
def test_stages_2_and_3_at_ep2_follow_one_process_and_stage_0(four_ranks, one_process):
    assert one_process["reference"]["auxiliary"][0]["moe_dropped_fraction"] == 0.0  # dropless
    assert len(one_process["reference"]["losses"]) == STEPS
    assert_follows(four_ranks["ep2 stage0"], one_process["reference"], "ep 2 stage 0 against one process")
    for label in ("ep2 stage2", "ep2 stage3", "ep2 stage2 offload", "ep4 stage3", "ep2 tp2 stage3"):
        assert_follows(four_ranks[label], one_process["reference"], label)
        assert_follows(four_ranks[label], four_ranks["ep2 stage0"], label)
    assert_follows(four_ranks["2 experts ep2 stage3"], four_ranks["2 experts ep2 stage0"], "1 local expert")
    assert four_ranks["ep2 stage3 bf16"]["losses"] == pytest.approx(four_ranks["ep2 stage0 bf16"]["losses"],
                                                                    abs=BF16_LOSS_ATOL)


@pytest.mark.slow  # 4-rank runs
@pytest.mark.timeout(900)
def test_the_readme_t5_fp16_moe_zero2_example_at_ep2_follows_its_stage_0(four_ranks):
    example = readme_example_config()
    assert example.parallelism.zero_stage == 2 and example.precision.fp16
    assert example.moe.expert_model_parallel_size == 2
    example_run, stage0 = four_ranks["t5 example"], four_ranks["t5 stage0"]
    # Capacity 1.0 drops assignments, the same ones in every layout.
    assert all(step["moe_dropped_fraction"] > 0 for step in stage0["auxiliary"])
    assert_follows(example_run, stage0, "the README's T5 example")


@pytest.mark.slow  # 4-rank runs
@pytest.mark.timeout(900)
def test_a_checkpoint_saved_at_ep2_stage3_resumes_at_ep1_stage0_and_ep2_stage1(
        four_ranks, one_process, tiny_prefix, cache_dir, workdir, saved):
    curve = one_process["reference"]["losses"][HALF:]
    ep2_stage1 = run_in_processes(2, [moe_config(tiny_prefix, cache_dir, ep=2, stage=1, load=saved)], workdir)[0]
    for resumed in (one_process["resumed"], ep2_stage1):
        assert resumed["losses"] == pytest.approx(curve, abs=LOSS_ATOL)


@pytest.mark.parametrize("stage", [2, 3])
def test_expert_parallelism_is_accepted_at_the_fsdp2_stages(tiny_prefix, cache_dir, stage):
    config = moe_config(tiny_prefix, cache_dir, ep=2, stage=stage)
    dims = resolve_parallel_dims(config, 4, model_spec(config.model.model).layout_rules)
    assert (dims.dp, dims.ep) == (4, 2)


@pytest.mark.parametrize(("local_shape", "expert_dp", "dim"), [
    ((4, 16, 64), 2, 0),   # the local experts divide evenly: shard them
    ((1, 16, 64), 2, 1),   # one local expert for two ranks: the input dimension (torchtitan's choice)
    ((3, 5, 64), 2, 2),    # the first dimension that divides evenly
    ((3, 5, 7), 2, 0),     # none does: the experts, padded (FSDP2 pads dim 0 only)
])
def test_expert_weights_shard_on_the_first_evenly_divisible_dimension(local_shape, expert_dp, dim):
    assert expert_shard_placement(expert_dp)(torch.nn.Parameter(torch.empty(local_shape))) == Shard(dim)


@pytest.mark.slow  # 4-rank runs
@pytest.mark.timeout(900)
def test_print_memory_at_ep2_stage3_counts_every_weight_sharded_over_all_four_ranks(four_ranks, saved, saved_metrics):
    """Experts over ep 2 x expert_dp 2, the rest over dp 4: a quarter of every tensor per rank (the tiny model's
    dimensions all divide by 4: no padding). Sizes from the checkpoint's metadata, a separate path."""
    metadata = FileSystemReader(str(checkpoint_dir(saved, HALF))).read_metadata().state_dict_metadata
    sizes = [math.prod(meta.size) for name, meta in metadata.items() if name.startswith("model.")]
    shard = FP32_BYTES * sum(sizes) // WORLD
    want = {"parameters_device": shard, "gradients_device": shard,
            "optimizer_device": MOMENTS * shard + STEP_BYTES * len(sizes),
            "parameters_cpu": 0, "gradients_cpu": 0, "optimizer_cpu": 0}
    [record] = read_run(saved_metrics).memory
    assert [entry["rank"] for entry in record["memory"]] == list(range(WORLD))
    for entry in record["memory"]:
        assert {key: entry[key] for key in want} == want, f"rank {entry['rank']}"
