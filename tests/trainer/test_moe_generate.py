"""Generation with expert parallelism (``generate --expert-model-parallel-size E``, train's spellings): each MoE
layer's experts are sharded over E data-parallel processes, each generating its own prompts, and a rank holds
only its experts. Switch Transformers' greedy ids equal transformers' token for token at EP 2 (the command, 2
processes) and at EP 2 x 2 replicas, EP 2 x TP 2, EP 2 x PP 2 and EP 4 (4 processes), from its directory and
from a converted checkpoint; a MoE GPT that ``train --num-experts 4`` trained 2 steps generates the same greedy
tokens at EP 1, 2 and 4; a layout the experts or the world do not divide into is refused in one line.

The Switch oracle is test_moe_switch's tiny random ``SwitchTransformersForConditionalGeneration`` (made
locally, seeded; its expert capacity drops tokens) with an EOS id its greedy output reaches, so rows stop at
different steps and the replicas of an ep group finish their batches at different steps; 5 prompts in batches
of 2 leave one replica a filler batch.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from process_testing import free_port, run_jobs
from test_moe_switch import EVERY, SMALL_CAPACITY, hf_switch, make_switch
from test_t5_hf import PAD
from trainer_testing import argv_for, tiny_config

from trainer.errors import TrainConfigError
from trainer.generation.generate import GenerateConfig
from trainer.models.dispatch import check_generation, generate
from trainer.generation.sampling import SamplingConfig
from trainer.checkpoint.hf_files import read_hf_config, write_json

PROMPTS = [[5, 17, 42, 99, 3, 64, 12], [120, 7, 64], [8, 150, 33, 21, 77, 190, 2, 9, 11], [42], [61, 180, 14, 88]]
NEW_TOKENS = 8
BATCH_SIZE = 2
# The EOS id is the token greedy decoding of the first prompt produces at this step.
EOS_STEP = 2
# (tensor, pipeline, expert) degrees of the 4-process runs: EP 2 x 2 replicas, EP 2 x TP 2, EP 2 x PP 2, EP 4.
FOUR_RANK_LAYOUTS = [(1, 1, 2), (2, 1, 2), (1, 2, 2), (1, 1, 4)]
GPT_EXPERTS = 4


@pytest.fixture(scope="module")
def switch(tmp_path_factory) -> Path:
    """The Switch directory, its config's EOS set to a token greedy decoding reaches."""
    directory = make_switch(tmp_path_factory.mktemp("moe_generate") / "switch", EVERY, SMALL_CAPACITY, seed=3)
    with torch.no_grad():
        ids = hf_switch(directory).generate(torch.tensor([PROMPTS[0]]), do_sample=False, max_new_tokens=EOS_STEP + 1,
                                            min_new_tokens=EOS_STEP + 1, decoder_start_token_id=PAD)[0, 1:]
    write_json(directory / "config.json", {**read_hf_config(directory), "eos_token_id": int(ids[EOS_STEP])})
    return directory


@pytest.fixture(scope="module")
def switch_expected(switch) -> list[list[int]]:
    """transformers' greedy continuation of each prompt on its own (stops right after EOS)."""
    reference, eos = hf_switch(switch), read_hf_config(switch)["eos_token_id"]
    with torch.no_grad():
        out = [reference.generate(torch.tensor([p]), do_sample=False, max_new_tokens=NEW_TOKENS, eos_token_id=eos,
                                  decoder_start_token_id=PAD)[0, 1:].tolist() for p in PROMPTS]
    assert sum(len(ids) < NEW_TOKENS for ids in out) >= 2, "some prompts should stop at EOS"
    return out


@pytest.fixture(scope="module")
def switch_checkpoint(switch, tmp_path_factory) -> Path:
    from trainer.cli.convert import main

    root = tmp_path_factory.mktemp("moe_generate") / "switch_ckpt"
    assert main(["--from-hf", str(switch), "--to", str(root)]) == 0
    return root


@pytest.fixture(scope="module")
def gpt_checkpoint(tiny_prefix, cache_dir, tmp_path_factory) -> Path:
    """A MoE GPT trained 2 steps by ``train --num-experts 4`` (top-1, so every expert sees few tokens)."""
    from trainer.cli.train import main

    root = tmp_path_factory.mktemp("moe_generate") / "gpt_ckpt"
    config = tiny_config(tiny_prefix, cache_dir, num_layers=2, train_iters=2, save=str(root))
    assert main([*argv_for(config), "--num-experts", str(GPT_EXPERTS), "--moe-router-topk", "1",
                 "--init-method-std", "0.3"]) == 0
    return root


def job_generate(load: str, tp: int, pp: int, ep: int) -> list[list[int]]:
    """Every prompt's greedy ids in a tp x pp (x dp: the rest of the world, ep of it per expert group) layout."""
    config = GenerateConfig(load=load, prompt_ids=PROMPTS, max_new_tokens=NEW_TOKENS,
                            sampling=SamplingConfig(greedy=True), batch_size=BATCH_SIZE, tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
                            expert_model_parallel_size=ep)
    return [c.ids for c in generate(config)]


def job_expert_shards(load: str, hf_dir: str, ep: int) -> list[list]:
    """Every rank's [ep rank, experts it holds per expert weight, whether they are the HF model's experts
    ep_rank E/ep ... (ep_rank + 1) E/ep - 1], gathered."""
    from trainer.models.t5.generate import _load_weights, plan_t5_generation
    from trainer.models.t5.hf import load_hf_t5
    from trainer.models.t5.sharded import ShardedT5
    from trainer.moe.parallel import is_expert_parameter

    plan = plan_t5_generation(GenerateConfig(load=load, prompt_ids=[[1]], expert_model_parallel_size=ep),
                              dist.get_world_size())
    mesh = plan.layout.build_mesh("cpu")
    model = ShardedT5(plan.source.shape, plan.source.vocab_size, plan.layout, mesh, torch.device("cpu"))
    _load_weights(model, plan.source, verify=True)
    full = dict(load_hf_t5(hf_dir).named_parameters())
    rank = mesh.get_local_rank("ep")
    held, same = set(), True
    for name, param in model.named_parameters():
        if is_expert_parameter(param):
            local = param.to_local()
            held.add(local.shape[0])
            same &= torch.equal(local, full[name][rank * len(local):(rank + 1) * len(local)])
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, [rank, sorted(held), same])
    return gathered


@pytest.fixture(scope="module")
def four_rank_results(switch, switch_checkpoint, gpt_checkpoint, tmp_path_factory) -> dict:
    """One 4-process launch: Switch (directory and checkpoint) and MoE GPT generations, and the expert shards."""
    layouts = [(str(switch), layout) for layout in FOUR_RANK_LAYOUTS] + [(str(switch_checkpoint), (1, 1, 2))]
    layouts += [(str(gpt_checkpoint), (1, 1, 2)), (str(gpt_checkpoint), (1, 1, 4))]
    jobs = [(job_generate, (load, *layout), {}) for load, layout in layouts]
    jobs += [(job_expert_shards, (str(switch_checkpoint), str(switch), 2), {}),
             (job_expert_shards, (str(switch), str(switch), 4), {})]
    results = run_jobs(4, jobs, tmp_path_factory.mktemp("moe_generate_runs"))
    generated = dict(zip(layouts, results[:len(layouts)], strict=True))
    return {"generated": generated, "shards": results[len(layouts):]}


def test_generate_command_at_ep_2_matches_transformers_token_for_token(switch, switch_expected, capsys):
    from trainer.cli.generate import main

    prompt_flags = [flag for prompt in PROMPTS for flag in ("--prompt-ids", " ".join(map(str, prompt)))]
    assert main(["--load", str(switch), "--greedy", "--json", "--max-new-tokens", str(NEW_TOKENS), "--device", "cpu",
                 "--batch-size", str(BATCH_SIZE), "--nproc-per-node", "2", "--master-port", str(free_port()),
                 "--expert-model-parallel-size", "2", *prompt_flags]) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["ids"] for r in records] == switch_expected


@pytest.mark.parametrize("layout", FOUR_RANK_LAYOUTS, ids=lambda l: "tp{}_pp{}_ep{}".format(*l))
def test_switch_at_ep_with_replicas_tp_and_pp_matches_transformers(four_rank_results, switch, switch_expected, layout):
    assert four_rank_results["generated"][(str(switch), layout)] == switch_expected


def test_a_converted_switch_checkpoint_generates_at_ep_2_as_transformers(four_rank_results, switch_checkpoint,
                                                                          switch_expected):
    assert four_rank_results["generated"][(str(switch_checkpoint), (1, 1, 2))] == switch_expected


def test_each_rank_holds_only_its_experts_from_a_checkpoint_or_a_directory(four_rank_results):
    at_ep_2, at_ep_4 = four_rank_results["shards"]
    # 4 experts: 2 per rank at EP 2 (ep ranks 0, 1, 0, 1: two expert groups), 1 at EP 4.
    assert at_ep_2 == [[0, [2], True], [1, [2], True], [0, [2], True], [1, [2], True]]
    assert at_ep_4 == [[r, [1], True] for r in range(4)]


def test_a_trained_moe_gpt_generates_the_same_at_ep_1_2_and_4(four_rank_results, gpt_checkpoint):
    one_process = job_generate(str(gpt_checkpoint), 1, 1, 1)
    assert len({token for ids in one_process for token in ids}) > 3, "the greedy output should be varied"
    for ep in (2, 4):
        assert four_rank_results["generated"][(str(gpt_checkpoint), (1, 1, ep))] == one_process, f"EP {ep}"


def _dense_t5(directory: Path) -> Path:
    from transformers import T5Config, T5ForConditionalGeneration

    config = T5Config(vocab_size=64, d_model=16, d_kv=4, d_ff=32, num_heads=2, num_layers=1, num_decoder_layers=1)
    T5ForConditionalGeneration(config).save_pretrained(directory)
    return directory


@pytest.mark.parametrize(("layout", "world", "message"), [
    ((1, 1, 3), 3, "num_experts (4) is not divisible by expert_model_parallel_size (3)"),
    ((2, 1, 2), 2, "the data-parallel size (1 = world size 2 / (tensor_model_parallel_size (2) x "
                   "pipeline_model_parallel_size (1))) is not divisible by expert_model_parallel_size (2)"),
    ((1, 1, 2), 3, "the data-parallel size (3 = world size 3"),
])
def test_layouts_the_experts_or_the_world_do_not_divide_into_are_refused(switch, layout, world, message):
    tp, pp, ep = layout
    config = GenerateConfig(load=str(switch), prompt_ids=[[1]], tensor_model_parallel_size=tp,
                            pipeline_model_parallel_size=pp, expert_model_parallel_size=ep)
    with pytest.raises(TrainConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        check_generation(config, world)


def test_bad_expert_layouts_fail_in_one_line_before_any_process_starts(switch, tmp_path, capsys):
    from trainer.cli.generate import main

    common = ["--prompt-ids", "1 2", "--device", "cpu", "--nproc-per-node", "2", "--master-port", str(free_port())]
    dense = _dense_t5(tmp_path / "t5")
    capsys.readouterr()  # transformers' saving progress
    assert main(["--load", str(dense), *common, "--moe_ep_size", "2"]) == 1
    assert capsys.readouterr().err == ("generate: error: --expert-model-parallel-size (2) needs a model with experts; "
                                       "this one is dense\n")
    assert main(["--load", str(switch), *common, "--expert-model-parallel-size", "4"]) == 1
    assert capsys.readouterr().err == ("generate: error: the data-parallel size (2 = world size 2 / "
                                       "(--tensor-model-parallel-size (1) x --pipeline-model-parallel-size (1))) is "
                                       "not divisible by --expert-model-parallel-size (4)\n")
