"""``train --compile`` (torch.compile of a one-process run's whole model, else of each block) and the AdamW kernel
choice.

Compiled and eager runs of the same tiny GPT (one process, and two data-parallel ones) give the same losses within
`COMPILE_RTOL`, and so do (`-m campaign`) T5, BERT, the Llama-class GPT, recomputation and keyed dropout; the
compiled run keeps its parameter names (checkpoints do not change); the AdamW kernel is fused on CUDA,
multi-tensor elsewhere, and the per-parameter loop where the parameter list mixes layouts; the state a
checkpoint loads into sits where the kernel reads it;
``benchmarks/gpu_step.py`` runs end to end on a CPU (tiny shapes) and refuses in one line without CUDA.
"""

import dataclasses
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, distribute_tensor
from test_bert_train import bert_config
from test_llama_parity import llama_config
from trainer_testing import LOSS_RTOL, result_record, run_in_processes, t5_config, tiny_config

from trainer.cli.train_args import build_parser, config_from_args
from trainer.config import OptimizerConfig, ParallelismConfig, RecomputeConfig
from trainer.models.gpt.model import GPTShape
from trainer.optim.optimizer import ADAMW_KERNEL_OPTIONS, build_optimizer, init_optimizer_state, select_adamw_kernel
from trainer.parallel.dims import ParallelDims
from trainer.models.gpt.spec import PLAN as GPT_PLAN
from trainer.parallel.runner import ParallelModel

REPO = Path(__file__).resolve().parents[2]
STEPS = 3
DATA_PARALLEL = 2
# Inductor's CPU code fuses the norms, softmax and GELU into loops of its own and vectorises their sums
# in another order than the eager kernels: activations differ by a few fp32 ulps (eps = 1.2e-7
# relative), and AdamW, which divides every update by sqrt(v), turns ulp-sized gradient differences of
# small gradients into lr-sized weight differences over the steps: the drift of tensor parallelism's
# split sums, with the parity tests' tolerance. Measured over these 3 steps: 9e-8 relative (GPT), 5e-8
# (T5). A block left out of the graph, or a wrong graph, changes the loss by percents.
COMPILE_RTOL = LOSS_RTOL


def compiled(config):
    return dataclasses.replace(config, training=dataclasses.replace(config.training, compile=True))


def short_run(config):
    """``config`` cut to ``STEPS`` steps of one layer, without evaluation: compiling is slow on a CPU."""
    return dataclasses.replace(
        config, model=dataclasses.replace(config.model, num_layers=1),
        training=dataclasses.replace(config.training, train_iters=STEPS),
        logging=dataclasses.replace(config.logging, eval_iters=0))


@pytest.fixture
def fresh_compiler(tmp_path, monkeypatch):
    """Inductor's on-disk cache inside tmp_path, and dynamo's in-memory caches emptied afterwards."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def assert_same_losses(compiled_result: dict, eager_result: dict) -> None:
    assert len(compiled_result["losses"]) == STEPS
    assert compiled_result["losses"] == pytest.approx(eager_result["losses"], rel=COMPILE_RTOL)
    assert compiled_result["grad_norms"] == pytest.approx(eager_result["grad_norms"], rel=COMPILE_RTOL)


def test_compiled_gpt_trains_like_eager(tiny_prefix, cache_dir, fresh_compiler):
    config = short_run(tiny_config(tiny_prefix, cache_dir))
    assert_same_losses(result_record(compiled(config)), result_record(config))


# The default suite compiles T5's blocks in test_moe_compile's Switch-T5 run (dense and expert layers).
@pytest.mark.campaign
def test_compiled_t5_trains_like_eager(sentence_prefix, data_test, tmp_path, fresh_compiler):
    config = short_run(t5_config(sentence_prefix, data_test, str(tmp_path / "cache")))
    assert_same_losses(result_record(compiled(config)), result_record(config))


def _with(config, section: str, **fields):
    return dataclasses.replace(config, **{section: dataclasses.replace(getattr(config, section), **fields)})


# The whole model in one graph, with what its forward holds: recomputation (torch.utils.checkpoint inside the
# graph), keyed dropout's per-sample random streams, and the other families' forwards.
WHOLE_MODEL_CASES = {
    "recompute-full": lambda base: dataclasses.replace(
        base, recompute=RecomputeConfig(recompute_granularity="full", recompute_method="uniform",
                                        recompute_num_layers=1)),
    "recompute-selective": lambda base: dataclasses.replace(
        base, recompute=RecomputeConfig(recompute_granularity="selective")),
    "checkpoint-activations": lambda base: _with(base, "training", checkpoint_activations=True),
    "keyed-dropout": lambda base: _with(_with(base, "model", hidden_dropout=0.1), "parallelism", keyed_dropout=True),
}


@pytest.mark.campaign
@pytest.mark.parametrize("case", [*WHOLE_MODEL_CASES, "bert", "llama"])
def test_a_compiled_whole_model_trains_like_eager(case, tiny_prefix, cache_dir, wordpiece_sentences, data_test,
                                                   tmp_path, fresh_compiler):
    if case == "bert":
        config = bert_config(wordpiece_sentences, data_test, str(tmp_path / "cache"))
    elif case == "llama":
        config = llama_config(tiny_prefix, cache_dir)
    else:
        config = WHOLE_MODEL_CASES[case](tiny_config(tiny_prefix, cache_dir))
    config = short_run(config)
    assert_same_losses(result_record(compiled(config)), result_record(config))


def test_compile_keeps_parameter_names_and_compiles_a_one_process_model_whole():
    shape = GPTShape(num_layers=2, hidden_size=32, num_attention_heads=2, ffn_hidden_size=64,
                     max_position_embeddings=8, padded_vocab_size=64)
    dims = ParallelDims(pp=1, dp=1, tp=1, micro_batch_size=1, num_microbatches=1)
    args = (GPT_PLAN, shape, dims, None, ParallelismConfig(), torch.device("cpu"), 0, False, None)
    eager, compiled_model = ParallelModel(*args), ParallelModel(*args, compile_blocks=True)
    assert [n for n, _ in compiled_model.named_parameters()] == [n for n, _ in eager.named_parameters()]
    # Building compiles nothing yet (torch.compile is lazy): the forward is only wrapped, the whole model's
    # (as `torch.compile(model)`: one graph, no host work between blocks), not each block's.
    assert "forward" in vars(compiled_model.parts[0]) and "forward" not in vars(eager.parts[0])
    assert not any("forward" in vars(block) for block in compiled_model.parts[0].layers.values())


@pytest.mark.timeout(600)
def test_compiled_data_parallel_run_compiles_each_block_and_trains_like_eager(tiny_prefix, cache_dir, workdir,
                                                                              tmp_path, monkeypatch):
    # Two processes: DDP wraps the model, so each block is compiled on its own (torchtitan's rule; DDP's
    # bucketed all-reduces run between the blocks' backward graphs).
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))  # the spawned processes inherit it
    eager = short_run(tiny_config(tiny_prefix, cache_dir))
    compiled_result, eager_result = run_in_processes(DATA_PARALLEL, [compiled(eager), eager], workdir)
    assert_same_losses(compiled_result, eager_result)


def test_compile_is_a_train_flag():
    parser = build_parser()
    base = ["--num-layers", "1", "--dataset", "data/x_text_document"]
    assert config_from_args(parser.parse_args(base + ["--compile"])).training.compile
    assert not config_from_args(parser.parse_args(base)).training.compile


def test_adamw_kernel_is_fused_on_cuda_and_cpus_and_foreach_elsewhere():
    params = [torch.zeros(2, 2), torch.zeros(2)]
    assert select_adamw_kernel("cuda", params) == "fused"
    assert select_adamw_kernel("cpu", params) == "fused"
    assert select_adamw_kernel("mps", params) == "foreach"
    assert ADAMW_KERNEL_OPTIONS["fused"] == {"fused": True}


@pytest.fixture
def single_process_group(tmp_path):
    """A one-process gloo group (DTensors need one), its rendezvous file inside tmp_path."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_adamw_kernel_falls_back_to_the_loop_on_mixed_layouts(single_process_group):
    mesh = init_device_mesh("cpu", (1,))
    dtensor = distribute_tensor(torch.zeros(2, 2), mesh, [Replicate()])
    # Tensor parallelism leaves norm weights plain beside sharded DTensors: one list cannot hold both.
    assert select_adamw_kernel("cuda", [dtensor, torch.zeros(2)]) == "for-loop"
    assert select_adamw_kernel("cpu", [dtensor, torch.zeros(2)]) == "for-loop"
    # All DTensors on one mesh (FSDP2 alone) keep the fast kernels.
    assert select_adamw_kernel("cuda", [dtensor, dtensor]) == "fused"
    assert select_adamw_kernel("cpu", [dtensor]) == "fused"


def test_cpu_run_uses_the_fused_kernel_and_says_so_once(tiny_prefix, cache_dir, caplog):
    caplog.set_level(logging.INFO, logger="trainer.train")
    result_record(tiny_config(tiny_prefix, cache_dir, train_iters=1))
    assert caplog.text.count("AdamW kernel: ") == 1
    assert "AdamW kernel: fused" in caplog.text


def test_build_optimizer_passes_the_kernel_to_adamw():
    named = [("w", torch.nn.Parameter(torch.zeros(2, 2)))]
    optimizer = build_optimizer(named, OptimizerConfig(), **ADAMW_KERNEL_OPTIONS["for-loop"])
    assert optimizer.param_groups[0]["foreach"] is False


@pytest.mark.parametrize("kernel", ["fused", "foreach", "for-loop"])
def test_optimizer_state_made_before_a_load_sits_where_the_kernel_reads_it(kernel):
    # A resumed run creates the state, loads the checkpoint into it in place, then steps. The fused kernel reads
    # the step count on the parameter's device (on a GPU it refuses a CPU tensor); the others keep it on the
    # CPU, as torch's AdamW does. The meta device stands for a device other than the CPU.
    param = torch.nn.Parameter(torch.zeros(2, 2, device="meta"))
    optimizer = build_optimizer([("w", param)], OptimizerConfig(), **ADAMW_KERNEL_OPTIONS[kernel])
    init_optimizer_state(optimizer)
    state = optimizer.state[param]
    assert (state["step"].device.type, state["step"].dtype) == ("meta" if kernel == "fused" else "cpu",
                                                                 torch.float32)
    assert {state["exp_avg"].device.type, state["exp_avg_sq"].device.type} == {"meta"}


def _gpu_step(*argv: str, **environment: str) -> subprocess.CompletedProcess:
    """Run benchmarks/gpu_step.py as the README does (tests do not import the benchmarks)."""
    return subprocess.run([sys.executable, "-m", "benchmarks.gpu_step", *argv], cwd=REPO, capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": str(REPO), **environment}, timeout=300)


def test_gpu_benchmark_runs_end_to_end_on_a_cpu():
    run = _gpu_step("--tiny", "--device", "cpu", "--steps", "2")
    assert run.returncode == 0, run.stderr
    for title in ("GPT-345M (tiny)", "mT5-base (tiny)"):
        assert f"{title}: micro-batch 2 x " in run.stdout
    assert run.stdout.count("ratio ours/plain: ") == 2
    assert run.stdout.count("tokens/s") == 4


def test_gpu_benchmark_without_cuda_says_so_in_one_line():
    run = _gpu_step("--steps", "1", CUDA_VISIBLE_DEVICES="")
    assert run.returncode == 2
    assert run.stdout == ""
    assert run.stderr.count("\n") == 1 and "no CUDA device" in run.stderr
