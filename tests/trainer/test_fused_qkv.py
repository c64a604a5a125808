"""``--fused-qkv`` (OneFlow GPT's ``--multihead-attention-fusion``): one [3h, h] q/k/v projection whose rows
go per head. It trains exactly like three projections, shards per head under tensor parallelism, and
checkpoints and Hugging Face exports hold the unfused names, so runs with and without it resume each other.
"""

import dataclasses
import json

import pytest
import torch
from hf_testing import LOGIT_TOLERANCE, hf_model, make_tiny_hf, prompt_batch
from trainer_testing import TINY_STEPS, argv_for, result_record, run_in_processes, tiny_config

from trainer.checkpoint.load import SafeFileSystemReader
from trainer.checkpoint.store import MODEL_CONFIG_FILE, checkpoint_dir
from trainer.cli.train import main
from trainer.cli.train_args import build_parser, config_from_args
from trainer.cli.convert import main as convert_checkpoint
from trainer.models.gpt.fused_qkv import fuse_qkv, fuse_state, split_qkv
from trainer.models.gpt.convert import checkpoint_model, load_hf_weights, read_checkpoint_state
from trainer.models.gpt.model import GPT, GPTShape

HALF = TINY_STEPS // 2
# Fusion changes no forward arithmetic (each output is the same dot product over h), but the input gradient
# of one [3h, h] GEMM sums over 3h rows at once where three linears add three h-row sums, so gradients may
# differ by ulps (fp32 eps = 1.2e-7, relative). AdamW divides each update by sqrt(v), which turns ulp-sized
# differences of tiny gradients into lr-sized weight differences, so over 10 steps losses may drift by a few
# 1e-6 relative (measured on CPU: identical). Tensor parallelism adds its all-reduce's reordering, the same
# bound as the parity tests (1e-4 on losses of ~5.4). Mixing up q, k and v rows moves the loss by percents.
FUSION_RTOL = 2e-5
SHAPE = GPTShape(num_layers=2, hidden_size=32, num_attention_heads=4, ffn_hidden_size=64, max_position_embeddings=16,
                 padded_vocab_size=64)


def fused(config):
    """``config`` with the fused projection."""
    return dataclasses.replace(config, model=dataclasses.replace(config.model, fused_qkv=True))


def assert_losses_follow(got: list[float], want: list[float]) -> None:
    assert len(got) == len(want)
    for step, (g, w) in enumerate(zip(got, want), start=1):
        assert g == pytest.approx(w, rel=FUSION_RTOL), f"loss of step {step}"


def saved_names(root) -> set[str]:
    iteration = int((root / "latest_checkpointed_iteration.txt").read_text())
    return set(SafeFileSystemReader(checkpoint_dir(root, iteration)).read_metadata().state_dict_metadata)


# -- layout and init --------------------------------------------------------------------------------------

def test_fused_rows_are_q_k_v_of_each_head_in_turn():
    heads, head_dim = 2, 3
    q, k, v = (torch.arange(heads * head_dim) + 100 * index for index in range(3))
    fused_bias = fuse_qkv(q, k, v, num_heads=heads)
    assert fused_bias.tolist() == [0, 1, 2, 100, 101, 102, 200, 201, 202, 3, 4, 5, 103, 104, 105, 203, 204, 205]
    weight = torch.randn(3 * heads * head_dim, 5)
    assert torch.equal(fuse_qkv(*split_qkv(weight, heads), num_heads=heads), weight)


def test_fused_model_has_one_projection_initialised_as_the_three():
    torch.manual_seed(7)
    plain = dict(GPT(SHAPE).named_parameters())
    torch.manual_seed(7)
    one = dict(GPT(dataclasses.replace(SHAPE, fused_qkv=True)).named_parameters())
    h = SHAPE.hidden_size
    assert one["layers.0.attention.wqkv.weight"].shape == (3 * h, h)
    assert one["layers.0.attention.wqkv.bias"].shape == (3 * h,)
    assert not any(".wq." in name or ".wk." in name or ".wv." in name for name in one)
    assert fuse_state(plain, SHAPE.num_attention_heads).keys() == one.keys()
    for name, tensor in fuse_state(plain, SHAPE.num_attention_heads).items():
        assert torch.equal(one[name], tensor), name


def test_fused_training_follows_unfused(reference, tiny_prefix, cache_dir):
    result = result_record(fused(tiny_config(tiny_prefix, cache_dir, eval_iters=1)))
    assert_losses_follow(result["losses"], reference["losses"])
    for split, loss in result["eval_losses"].items():
        assert loss == pytest.approx(reference["eval_losses"][split], rel=FUSION_RTOL), split


# -- checkpoints ------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def fused_straight(tiny_prefix, cache_dir) -> dict:
    return result_record(fused(tiny_config(tiny_prefix, cache_dir)))


def test_fused_checkpoint_holds_the_unfused_names_and_resumes_either_way(fused_straight, reference, tiny_prefix,
                                                                         cache_dir, tmp_path):
    fused_save, plain_save = tmp_path / "fused", tmp_path / "plain"
    result_record(fused(tiny_config(tiny_prefix, cache_dir, train_iters=HALF, save=str(fused_save))))
    result_record(tiny_config(tiny_prefix, cache_dir, train_iters=HALF, save=str(plain_save)))
    names = saved_names(fused_save)
    assert names == saved_names(plain_save)
    assert "optim.layers.0.attention.wq.weight.exp_avg" in names and not any("wqkv" in n for n in names)
    assert (json.loads((fused_save / MODEL_CONFIG_FILE).read_text())
            == json.loads((plain_save / MODEL_CONFIG_FILE).read_text()))
    # Fused -> fused is an exact permutation there and back: bit for bit.
    again = result_record(fused(tiny_config(tiny_prefix, cache_dir, load=str(fused_save))))
    assert again["losses"] == fused_straight["losses"][HALF:]
    # Across the switch the arithmetic differs by ulps only.
    unfused = result_record(tiny_config(tiny_prefix, cache_dir, load=str(fused_save)))
    assert_losses_follow(unfused["losses"], fused_straight["losses"][HALF:])
    into_fused = result_record(fused(tiny_config(tiny_prefix, cache_dir, load=str(plain_save))))
    assert_losses_follow(into_fused["losses"], reference["losses"][HALF:])


# -- tensor parallelism and FSDP2 -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def parallel_runs(tiny_prefix, cache_dir, workdir) -> dict:
    """One 2-process launch: fused TP 2 straight, fused TP 2 and fused FSDP2 first halves saved, and fused
    TP 2 resumed from a one-process unfused checkpoint."""
    plain_save = workdir / "fused_qkv_plain_half"
    result_record(tiny_config(tiny_prefix, cache_dir, train_iters=HALF, save=str(plain_save)))
    runs = {"tp2": fused(tiny_config(tiny_prefix, cache_dir, tp=2, eval_iters=1)),
            "tp2_half": fused(tiny_config(tiny_prefix, cache_dir, tp=2, train_iters=HALF,
                                          save=str(workdir / "fused_qkv_tp2_half"))),
            "fsdp2_half": fused(tiny_config(tiny_prefix, cache_dir, distributed_optimizer=True, train_iters=HALF,
                                            save=str(workdir / "fused_qkv_fsdp2_half"))),
            "tp2_from_plain": fused(tiny_config(tiny_prefix, cache_dir, tp=2, load=str(plain_save)))}
    return dict(zip(runs, run_in_processes(2, list(runs.values()), workdir)))


@pytest.mark.timeout(600)
def test_tensor_parallel_fused_follows_one_process(parallel_runs, reference):
    assert_losses_follow(parallel_runs["tp2"]["losses"], reference["losses"])
    for split, loss in parallel_runs["tp2"]["eval_losses"].items():
        assert loss == pytest.approx(reference["eval_losses"][split], rel=FUSION_RTOL), split
    assert_losses_follow(parallel_runs["tp2_from_plain"]["losses"], reference["losses"][HALF:])


@pytest.mark.timeout(600)
@pytest.mark.parametrize("layout", ["tp2", "fsdp2"])
def test_parallel_fused_checkpoint_resumes_unfused_in_one_process(layout, parallel_runs, reference, tiny_prefix,
                                                                  cache_dir, workdir):
    assert_losses_follow(parallel_runs[f"{layout}_half"]["losses"], reference["losses"][:HALF])
    resumed = result_record(tiny_config(tiny_prefix, cache_dir, load=str(workdir / f"fused_qkv_{layout}_half")))
    assert_losses_follow(resumed["losses"], reference["losses"][HALF:])


# -- Hugging Face -----------------------------------------------------------------------------------------

def logits_of(model: GPT, tokens: torch.Tensor, vocab_size: int) -> torch.Tensor:
    with torch.no_grad():
        return model.eval()(tokens, torch.arange(tokens.shape[1]).expand_as(tokens))[..., :vocab_size]


def test_hf_export_of_a_fused_run_gives_its_logits_in_transformers(tiny_prefix, cache_dir, tmp_path):
    result_record(fused(tiny_config(tiny_prefix, cache_dir, train_iters=3, save=str(tmp_path / "ckpt"))))
    assert convert_checkpoint(["--from", str(tmp_path / "ckpt"), "--to-hf", str(tmp_path / "hf")]) == 0
    root, iteration, info = checkpoint_model(tmp_path / "ckpt")
    shape = dataclasses.replace(info.shape, fused_qkv=True)
    ours = GPT(shape)
    ours.load_state_dict(fuse_state(read_checkpoint_state(root, iteration, shape), shape.num_attention_heads),
                         strict=False)
    tokens = torch.tensor(prompt_batch((16,) * 3, vocab_size=info.vocab_size))
    with torch.no_grad():
        want = hf_model(tmp_path / "hf")(tokens).logits
    assert torch.allclose(logits_of(ours, tokens, info.vocab_size), want, rtol=0, atol=LOGIT_TOLERANCE)


def test_hf_weights_load_into_a_fused_model(tmp_path):
    hf_dir = make_tiny_hf(tmp_path / "tiny")
    config = json.loads((hf_dir / "config.json").read_text())
    shape = GPTShape(num_layers=config["n_layer"], hidden_size=config["n_embd"], num_attention_heads=config["n_head"],
                     ffn_hidden_size=4 * config["n_embd"], max_position_embeddings=config["n_positions"],
                     padded_vocab_size=384, fused_qkv=True)
    model = GPT(shape)
    load_hf_weights(list(model.named_parameters()), hf_dir, shape)
    tokens = torch.tensor(prompt_batch((12,) * 4))
    with torch.no_grad():
        want = hf_model(hf_dir)(tokens).logits
    assert torch.allclose(logits_of(model, tokens, config["vocab_size"]), want, rtol=0, atol=LOGIT_TOLERANCE)


# -- command line -----------------------------------------------------------------------------------------

def test_oneflow_spelling_is_the_same_switch():
    parser = build_parser()
    assert config_from_args(parser.parse_args(["--multihead-attention-fusion"])).model.fused_qkv
    assert config_from_args(parser.parse_args(["--fused-qkv"])).model.fused_qkv
    assert not config_from_args(parser.parse_args([])).model.fused_qkv
    assert "--multihead-attention-fusion" in parser.format_help()


def test_oneflow_gpt_command_line_trains_fused(tiny_prefix, cache_dir, tmp_path):
    """OneFlow GPT's pre-training flags (sizes made tiny, fp16 left out on CPU) train with fusion and save
    a checkpoint in the unfused names."""
    oneflow = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--micro-batch-size", "2",
               "--global-batch-size", "4", "--num-gpus-per-node", "1", "--train-iters", "2", "--learning-rate",
               "0.00015", "--dataset", tiny_prefix, "--seq-length", "32", "--split", "949,50,1", "--min-lr", "1.0e-5",
               "--lr-decay-style", "cosine", "--lr-decay-iters", "320000", "--lr-warmup-fraction", "0.01",
               "--weight-decay", "1e-2", "--optimizer", "adamw", "--clip-grad", "1.0", "--vocab-size", "256",
               "--save", str(tmp_path / "checkpoint"), "--save-interval", "10000", "--log-interval", "100",
               "--checkpoint-activations", "--multihead-attention-fusion"]
    assert main(oneflow + ["--device", "cpu", "--data-cache-path", cache_dir, "--eval-iters", "0",
                           "--metrics-file", str(tmp_path / "metrics.jsonl")]) == 0
    assert "model.layers.1.attention.wv.bias" in saved_names(tmp_path / "checkpoint")


def test_fusion_with_t5_is_one_line(tiny_prefix, cache_dir, capsys):
    argv = argv_for(tiny_config(tiny_prefix, cache_dir)) + ["--model", "t5", "--multihead-attention-fusion"]
    assert main(argv) != 0
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "--fused-qkv applies to model gpt only" in lines[0], lines
