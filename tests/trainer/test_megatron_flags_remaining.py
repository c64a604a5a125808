"""The last Megatron example-script flags `train` used to stop at as unknown (issue 29, section 3), each with
Megatron's meaning or a one-line refusal that says why:

- every ``--fp8-*`` flag of Megatron's Llama-3 fp8 example is parsed and refused in one line naming the flag:
  fp8 needs NVIDIA Transformer Engine on a Hopper-or-newer GPU, this trainer computes in bf16/fp16/fp32;
- ``--attention-softmax-in-fp32`` is what every attention here already does (SDPA's math kernel upcasts bf16
  and fp16 to float32 for its softmax; checked below against a float32 reference): the same losses, and
  ``--help`` says why;
- ``--grad-reduce-in-bf16`` (with bf16) reduces the data-parallel gradients in bfloat16 on each path (DDP,
  FSDP2 at ZeRO 2, the averaging after backward under tensor parallelism): in a 2-process run the collectives
  carry bfloat16 gradients, and the losses stay within bf16 rounding of the float32 reduction's; without bf16,
  with accumulate_allreduce_grads_in_fp32 or with expert parallelism it is refused in one line;
- ``--no-mmap-bin-files`` reads each ``.bin`` with plain file reads, no memory map: the same tokens, the same
  losses (GPT data; another model's data refused in one line);
- ``--mock-data`` and ``--calculate-per-token-loss``, once refused here, are implemented now (test_mock_data.py,
  test_per_token_loss.py);
- ``--num-workers`` is accepted (the trainer's read-ahead thread reads the batches): the same batches, the same
  losses, a negative count refused in one line.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from process_testing import run_jobs
from trainer_testing import argv_for, tiny_config

from indexed_dataset.reader import FileTokens, IndexedDataset
from trainer.cli.train import main
from trainer.cli.train_args import build_parser
from trainer.config import TrainConfig
from trainer.train import train

# Megatron's examples/llama/train_llama3_8b_h100_fp8.sh (its fp8 block) and the other fp8 flags of
# megatron-core's TransformerConfig that a script may give.
FP8_FLAGS = [
    ["--fp8-format", "hybrid"],
    ["--fp8-format", "e4m3"],
    ["--fp8-recipe", "delayed"],
    ["--fp8-amax-history-len", "1024"],
    ["--fp8-amax-compute-algo", "max"],
    ["--fp8-margin", "0"],
    ["--fp8-interval", "1"],
    ["--fp8-param-gather"],
]


def tiny_argv(tiny_prefix: str, cache_dir: str, **overrides) -> list[str]:
    return argv_for(tiny_config(tiny_prefix, cache_dir, train_iters=2, num_layers=1, hidden_size=16, **overrides))


def assert_one_line_refusal(capsys, flag: str, *words: str) -> None:
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1, lines
    assert flag in lines[0] and "Traceback" not in lines[0] and "unrecognized" not in lines[0], lines[0]
    for word in words:
        assert word in lines[0], lines[0]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("fp8_flag", FP8_FLAGS, ids=lambda argv: " ".join(argv))
def test_every_fp8_flag_is_refused_in_one_line_naming_it(fp8_flag, tiny_prefix, cache_dir, tmp_path, capsys):
    save = tmp_path / "ckpt"
    before = sorted(tmp_path.iterdir())
    assert main([*tiny_argv(tiny_prefix, cache_dir), "--bf16", "--save", str(save), *fp8_flag]) != 0
    assert_one_line_refusal(capsys, fp8_flag[0], "Transformer Engine", "bf16")
    assert sorted(tmp_path.iterdir()) == before


@pytest.mark.timeout(60)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_sdpa_math_kernel_takes_its_softmax_in_float32(dtype):
    """What makes --attention-softmax-in-fp32 the same math: the unfused (math) kernel under bf16/fp16 gives
    the float32 softmax's result (rounded once), not the low-precision softmax's."""
    generator = torch.Generator().manual_seed(0)
    q, k, v = [(3 * torch.randn(1, 4, 64, 32, generator=generator)).to(dtype) for _ in range(3)]
    causal = torch.ones(64, 64, dtype=torch.bool).tril()

    def reference(compute: torch.dtype) -> torch.Tensor:
        scores = (q.to(compute) @ k.to(compute).transpose(-1, -2)) / 32 ** 0.5
        probs = torch.softmax(scores.masked_fill(~causal, float("-inf")), dim=-1)
        return (probs @ v.to(compute)).to(dtype).float()

    with sdpa_kernel(SDPBackend.MATH):
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True).float()
    in_fp32 = (out - reference(torch.float32)).abs().max().item()
    in_low = (out - reference(dtype)).abs().max().item()
    assert in_fp32 < in_low / 10, (in_fp32, in_low)


@pytest.mark.timeout(300)
def test_attention_softmax_in_fp32_gives_the_same_losses(tiny_prefix, cache_dir):
    config = tiny_config(tiny_prefix, cache_dir, train_iters=2, num_layers=1, hidden_size=16)
    config.precision.bf16 = True
    config.kernels.attention_backend = "unfused"
    plain = train(config).losses
    config.precision.attention_softmax_in_fp32 = True
    assert train(config).losses == plain
    assert "changes nothing here" in help_of("--attention-softmax-in-fp32")


def help_of(flag: str) -> str:
    """The ``--help`` text of ``flag``."""
    return next(action.help for action in build_parser()._actions if flag in action.option_strings)


@pytest.mark.timeout(300)
def test_num_workers_reads_the_same_batches(tiny_prefix, cache_dir, capsys):
    config = tiny_config(tiny_prefix, cache_dir, train_iters=2, num_layers=1, hidden_size=16)
    plain = train(config).losses
    config.data.num_workers = 1
    assert train(config).losses == plain
    assert "read-ahead" in help_of("--num-workers") or "read ahead" in help_of("--num-workers")
    assert main([*tiny_argv(tiny_prefix, cache_dir), "--num-workers", "-1"]) != 0
    assert_one_line_refusal(capsys, "--num-workers", ">= 0")


# Relative loss difference bf16 rounding of the reduced gradients (2**-8 relative each) explains over a few
# small steps of a tiny model; the float32-vs-bf16 difference of a wrong reduction (a sum not averaged, a
# skipped reduction) is orders of magnitude larger.
BF16_REDUCTION_RTOL = 1e-2
# The data-parallel paths of a 2-process run (dp 2): DDP and FSDP2 (ZeRO 2). The averaging after backward
# (tensor/pipeline parallelism, which 2 processes would leave without data parallelism) is checked on its own.
REDUCTION_PATHS = {"ddp": {}, "fsdp2": {"zero_stage": 2}}


def losses_and_reduction_dtypes(config: TrainConfig) -> tuple[list[float], list[str]]:
    """One rank's losses of ``config`` and the floating dtypes its all-reduce / reduce-scatter calls carried."""
    seen: set[str] = set()
    # DDP's hook calls all_reduce; FSDP2 (torch 2.13) reduce_scatter_single (older torch: reduce_scatter_tensor).
    originals = {name: getattr(dist, name) for name in ("all_reduce", "reduce_scatter_single", "reduce_scatter_tensor")
                 if hasattr(dist, name)}

    def recording(original):
        def collective(*args, **kwargs):
            seen.update(str(arg.dtype) for arg in (*args, *kwargs.values())
                        if isinstance(arg, torch.Tensor) and arg.is_floating_point())
            return original(*args, **kwargs)
        return collective

    for name, original in originals.items():
        setattr(dist, name, recording(original))
    try:
        losses = train(config).losses
    finally:
        for name, original in originals.items():
            setattr(dist, name, original)
    return losses, sorted(seen)


def bf16_config(tiny_prefix: str, cache_dir: str, reduce_in_bf16: bool, **parallelism) -> TrainConfig:
    config = tiny_config(tiny_prefix, cache_dir, train_iters=3, num_layers=1, hidden_size=16)
    config.precision.bf16 = True
    config.parallelism.grad_reduce_in_bf16 = reduce_in_bf16
    for name, value in parallelism.items():
        setattr(config.parallelism, name, value)
    return config


@pytest.mark.timeout(480)
@pytest.mark.parametrize("path", sorted(REDUCTION_PATHS))
def test_grad_reduce_in_bf16_reduces_in_bf16_within_its_rounding(path, tiny_prefix, cache_dir, tmp_path):
    options = REDUCTION_PATHS[path]
    (fp32_losses, fp32_dtypes), (bf16_losses, bf16_dtypes) = run_jobs(2, [
        (losses_and_reduction_dtypes, (bf16_config(tiny_prefix, cache_dir, False, **options),), {}),
        (losses_and_reduction_dtypes, (bf16_config(tiny_prefix, cache_dir, True, **options),), {}),
    ], tmp_path)
    assert "torch.bfloat16" in bf16_dtypes and "torch.bfloat16" not in fp32_dtypes, (bf16_dtypes, fp32_dtypes)
    assert bf16_losses[0] == fp32_losses[0]  # the first forward pass precedes any reduction
    assert bf16_losses == pytest.approx(fp32_losses, rel=BF16_REDUCTION_RTOL)


@pytest.mark.timeout(60)
def test_average_gradients_reduces_in_the_dtype_asked(tmp_path):
    """The path under tensor/pipeline parallelism (no DDP wrapper): the all-reduce runs in bf16, so rank 1's
    1 + 2**-10 (below bf16's resolution at 1) averages with rank 0's 1 to 1, not float32's 1 + 2**-11."""
    assert run_jobs(2, [(averaged_in_bf16, (), {})], tmp_path) == [[["torch.bfloat16"], [1.0, 3.0]]]


def averaged_in_bf16() -> tuple[list[str], list[float]]:
    from trainer.parallel.zero import average_gradients

    param = torch.nn.Parameter(torch.zeros(2))
    param.grad = torch.tensor([1.0 + dist.get_rank() * 2**-10, 2.0 * (dist.get_rank() + 1)])
    seen: list[str] = []
    original = dist.all_reduce

    def recording(tensor, *args, **kwargs):
        seen.append(str(tensor.dtype))
        return original(tensor, *args, **kwargs)

    dist.all_reduce = recording
    try:
        average_gradients([param], dist.group.WORLD, torch.bfloat16)
    finally:
        dist.all_reduce = original
    assert param.grad.dtype == torch.float32
    return seen, param.grad.tolist()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("extra, words", [
    ([], "bf16 only"),
    (["--bf16", "--accumulate-allreduce-grads-in-fp32"], "not both"),
    (["--bf16", "--num-experts", "2", "--expert-model-parallel-size", "2"], "fp32 only"),
])
def test_grad_reduce_in_bf16_refusals(extra, words, tiny_prefix, cache_dir, capsys):
    assert main([*tiny_argv(tiny_prefix, cache_dir), "--grad-reduce-in-bf16", *extra]) != 0
    assert_one_line_refusal(capsys, "--grad-reduce-in-bf16", words)


@pytest.mark.timeout(60)
def test_the_bin_read_without_a_map_gives_the_same_tokens(tiny_prefix):
    mapped, read = IndexedDataset(tiny_prefix), IndexedDataset(tiny_prefix, mmap_bin=False)
    assert isinstance(read.tokens, FileTokens) and not hasattr(read, "_bin_map")
    assert read.num_tokens == mapped.num_tokens
    for index in range(read.num_sequences):
        assert np.array_equal(read.get(index), mapped.get(index))
    assert np.array_equal(read.get(0, offset=1, length=3), mapped.get(0, offset=1, length=3))
    last = read.num_documents
    assert np.array_equal(read.read_documents(0, last).tokens, mapped.read_documents(0, last).tokens)


@pytest.mark.timeout(300)
def test_no_mmap_bin_files_trains_the_same(tiny_prefix, cache_dir, monkeypatch):
    config = tiny_config(tiny_prefix, cache_dir, train_iters=2, num_layers=1, hidden_size=16)
    plain = train(config).losses
    reads: list[slice] = []
    read = FileTokens.__getitem__
    monkeypatch.setattr(FileTokens, "__getitem__", lambda tokens, index: reads.append(index) or read(tokens, index))
    config.data.no_mmap_bin_files = True
    assert train(config).losses == plain
    assert reads  # the samples' tokens came through plain file reads


@pytest.mark.timeout(60)
def test_no_mmap_bin_files_is_refused_for_other_models(tiny_prefix, cache_dir, capsys):
    assert main([*tiny_argv(tiny_prefix, cache_dir), "--model", "t5", "--no-mmap-bin-files"]) != 0
    assert_one_line_refusal(capsys, "--no-mmap-bin-files", "GPT data only")
