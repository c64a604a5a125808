"""The GPT decoder's Llama-class options, as megatron-core's GPT model takes them from its TransformerConfig.

- Rotary embeddings compute megatron-core 0.16.1's own frequencies and rotations (Llama 2, Llama 3.1 scaling,
  linear interpolation, a partial rotary dimension): `data_test/trainer/megatron_rope.npz`, written by
  `make_llama_rope_golden.py` with megatron-core itself.
- SwiGLU's default width is Megatron's validate_args rule; FLOPs per token count grouped-query projections and
  SwiGLU's three matmuls as Megatron's ``num_floating_point_operations``.
- Initialisation as Megatron: zero-centred norms start at 0, output projections at std/sqrt(2L), an untied head
  is a parameter of its own.
- One KV cache path: decoding a left-padded batch token by token with a grouped cache (groups, not heads)
  gives the logits of a full forward over each unpadded sequence, rotary positions continuing through it.
- Mixtral's router (softmax over all experts, top 2, renormalised) is Megatron's default top-k routing.
- GPT-2 (every option off) has the state-dict names and model_config.json keys it always had.
- Bad combinations are one line naming the flags: num_query_groups % tp, heads % groups, a group count without
  --group-query-attention, --no-position-embedding without rope, the options given to t5 or bert.
"""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
import torch

from trainer.cli.train import main
from trainer.cli.train_args import build_parser, config_from_args
from trainer.generation.kv_cache import KVCache
from trainer.models.gpt.convert import CheckpointModel, read_model_config, save_model_config
from trainer.models.gpt.generate import left_pad
from trainer.models.gpt.model import DECODER_OPTIONS, GPT, GPTShape
from trainer.models.gpt.rotary import RotarySettings, apply_rotary, inverse_frequencies, rotary_tables
from trainer.models.gpt.training import flops_per_token, model_shape
from trainer.moe.router import route

GPT2_SHAPE = GPTShape(num_layers=2, hidden_size=32, num_attention_heads=4, ffn_hidden_size=128,
                      max_position_embeddings=64, padded_vocab_size=128)
LLAMA_SHAPE = dataclasses.replace(
    GPT2_SHAPE, normalization="RMSNorm", apply_layernorm_1p=True, swiglu=True, ffn_hidden_size=48,
    position_embedding_type="rope", rotary_base=500000, rotary_percent=0.5, rope_scaling_factor=8.0,
    num_query_groups=2, kv_channels=16, add_bias_linear=False, add_qkv_bias=True, qk_layernorm=True,
    untie_embeddings_and_output_weights=True)
# The keys of a GPT-2 block and of model_config.json's shape before the options existed.
GPT2_BLOCK_NAMES = ["attention_norm.weight", "attention_norm.bias", "attention.wq.weight", "attention.wq.bias",
                    "attention.wk.weight", "attention.wk.bias", "attention.wv.weight", "attention.wv.bias",
                    "attention.wo.weight", "attention.wo.bias", "ffn_norm.weight", "ffn_norm.bias",
                    "feed_forward.w1.weight", "feed_forward.w1.bias", "feed_forward.w2.weight", "feed_forward.w2.bias"]
GPT2_SHAPE_KEYS = {"num_layers", "hidden_size", "num_attention_heads", "ffn_hidden_size", "max_position_embeddings",
                   "padded_vocab_size", "hidden_dropout", "attention_dropout", "init_method_std", "layernorm_epsilon",
                   "moe"}


# -- rotary embeddings: megatron-core's numbers --------------------------------------------------------------
def rope_cases(data_test):
    golden = np.load(data_test / "trainer" / "megatron_rope.npz")
    cases = json.loads(golden["cases"].tobytes())
    return golden, cases


def settings_of(case: dict) -> RotarySettings:
    """Megatron's RotaryEmbedding arguments -> our settings."""
    return RotarySettings(head_dim=case["kv_channels"], base=float(case["rotary_base"]), percent=case["rotary_percent"],
                          interpolation_factor=case.get("seq_len_interpolation_factor"),
                          llama3_factor=case["rope_scaling_factor"] if case.get("rope_scaling") else None)


def test_rotary_frequencies_and_rotations_are_megatron_cores(data_test):
    golden, cases = rope_cases(data_test)
    assert len(cases) == 5
    for name, case in cases.items():
        settings = settings_of(case)
        np.testing.assert_allclose(inverse_frequencies(settings).numpy(), golden[f"{name}.inv_freq"], rtol=1e-6,
                                   err_msg=name)
        x = torch.from_numpy(golden[f"{name}.input"])[None]  # [1, heads, seq, d]
        positions = torch.arange(x.shape[2])[None]
        rotated = apply_rotary(x, *rotary_tables(settings, positions))
        np.testing.assert_allclose(rotated[0].numpy(), golden[f"{name}.rotated"], rtol=1e-5, atol=1e-5,
                                   err_msg=name)


def test_llama3_scaling_divides_only_the_low_frequencies(data_test):
    golden, _ = rope_cases(data_test)
    plain = inverse_frequencies(RotarySettings(head_dim=16, base=500000.0))
    scaled = golden["llama3_1.inv_freq"]
    assert scaled[0] == pytest.approx(plain[0].item())          # the fastest pair is untouched
    assert scaled[-1] == pytest.approx(plain[-1].item() / 8)    # the slowest is divided by the factor


# -- widths, FLOPs, initialisation --------------------------------------------------------------------------
@pytest.mark.parametrize(("hidden", "expected"), [(4096, 10880), (64, 128), (100, 256)])
def test_swiglu_default_width_is_megatrons(hidden, expected):
    """validate_args: int((4 * h * 2 / 3) / 64) * 64 when --ffn-hidden-size is not given."""
    config = config_from_args(build_parser().parse_args(
        ["--dataset", "p", "--swiglu", "--hidden-size", str(hidden), "--num-attention-heads", "4"]))
    assert config.model.ffn_hidden_size == expected
    plain = config_from_args(build_parser().parse_args(["--dataset", "p", "--hidden-size", str(hidden),
                                                        "--num-attention-heads", "4"]))
    assert plain.model.ffn_hidden_size == 4 * hidden


def test_flops_per_token_counts_groups_and_swiglu():
    """Megatron's terms: q/o H d wide, k/v G d, three h x ffn matmuls; x3 forward+backward, x2 per MAC."""
    h, heads, groups, d, ffn, layers, vocab, seq = 32, 4, 2, 16, 48, 2, 128, 64
    q, kv = heads * d, groups * d
    per_layer = 2 * h * (q + 2 * kv) + 2 * q * h + 2 * 3 * h * ffn + 2 * 2 * seq * q
    expected = 3 * (layers * per_layer + 2 * h * vocab)
    assert flops_per_token(LLAMA_SHAPE, seq) == expected
    # GPT-2's formula is unchanged: 3 x (8 h^2 + 4 h ffn + 4 seq h) per layer plus the head.
    g = GPT2_SHAPE
    gpt2 = 3 * (g.num_layers * (8 * 32 * 32 + 4 * 32 * 128 + 4 * seq * 32) + 2 * 32 * 128)
    assert flops_per_token(GPT2_SHAPE, seq) == gpt2


def test_initialisation_follows_megatron():
    torch.manual_seed(0)
    shape = dataclasses.replace(LLAMA_SHAPE, hidden_size=256, num_attention_heads=8, ffn_hidden_size=512,
                                num_layers=8, kv_channels=32, num_query_groups=4, init_method_std=0.02)
    params = dict(GPT(shape).named_parameters())
    for name in ("layers.0.attention_norm.weight", "layers.0.attention.q_layernorm.weight", "norm.weight"):
        assert torch.all(params[name] == 0), f"{name}: zero-centred norms start at 0"
    assert torch.all(params["layers.0.attention.wq.bias"] == 0)
    assert "layers.0.attention.wo.bias" not in params and "layers.0.feed_forward.w1.bias" not in params
    scaled = 0.02 / math.sqrt(2 * shape.num_layers)
    for name, std in (("layers.0.attention.wq.weight", 0.02), ("layers.0.feed_forward.w3.weight", 0.02),
                      ("output.weight", 0.02), ("layers.0.attention.wo.weight", scaled),
                      ("layers.0.feed_forward.w2.weight", scaled)):
        assert params[name].std().item() == pytest.approx(std, rel=0.05), name
    assert params["output.weight"] is not params["tok_embeddings.weight"]
    assert "pos_embeddings.weight" not in params


# -- one KV cache path ---------------------------------------------------------------------------------------
def test_grouped_kv_cache_decodes_as_a_full_forward():
    """Left-padded prompts, then tokens one at a time: each step's logits are those of a full forward over the
    unpadded sequence so far (rope positions continue through the cache, which holds groups)."""
    torch.manual_seed(1)
    model = GPT(LLAMA_SHAPE).eval()
    prompts = [[5, 9, 11, 3, 7], [2, 8]]
    continuations = [[4, 6, 1], [12, 13, 14]]
    tokens, mask, positions = left_pad(prompts, torch.device("cpu"))
    cache = KVCache(mask, max_length=tokens.shape[1] + 3)
    lengths = mask.sum(dim=1)
    with torch.no_grad():
        logits = model(tokens, positions, kv_cache=cache.step(tokens.shape[1]))
        assert cache.layers["0"].keys.shape[1] == LLAMA_SHAPE.num_query_groups
        steps = [logits[:, -1]]
        for step in range(3):
            fed = torch.tensor([[c[step]] for c in continuations])
            steps.append(model(fed, (lengths + step)[:, None], kv_cache=cache.step(1))[:, -1])
        for row, prompt in enumerate(prompts):
            for step, got in enumerate(steps):
                sequence = torch.tensor([prompt + continuations[row][:step]])
                full = model(sequence, torch.arange(sequence.shape[1])[None])[0, -1]
                torch.testing.assert_close(got[row], full, rtol=1e-5, atol=1e-5)


def test_a_later_pipeline_stage_decodes_at_the_given_positions():
    """Generation hands every stage the positions (`ShardedGPT`): two stages over one cache decode as the whole
    model, left padding and all; without positions a stage would rotate by 0..n-1 instead."""
    from trainer.models.gpt.pipeline import split_stage

    torch.manual_seed(4)
    model = GPT(LLAMA_SHAPE).eval()
    first, last = split_stage(model, 0, 2), split_stage(model, 1, 2)
    tokens, mask, positions = left_pad([[5, 9, 11, 3], [2, 8]], torch.device("cpu"))
    whole, staged = (KVCache(mask, max_length=tokens.shape[1] + 2) for _ in range(2))
    with torch.no_grad():
        for fed, at in ((tokens, positions), (torch.tensor([[7], [6]]), mask.sum(dim=1)[:, None])):
            want = model(fed, at, kv_cache=whole.step(fed.shape[1]))
            step = staged.step(fed.shape[1])
            torch.testing.assert_close(last(first(fed, at, kv_cache=step), at, kv_cache=step), want)


def test_fused_qkv_holds_whole_groups():
    """The fused projection's rows per group ([G, H/G + 2, d]) give the unfused model's outputs."""
    from trainer.models.gpt.fused_qkv import fuse_state, split_qkv

    torch.manual_seed(2)
    plain = GPT(LLAMA_SHAPE)
    fused = GPT(dataclasses.replace(LLAMA_SHAPE, fused_qkv=True))
    fused.load_state_dict(fuse_state(plain.state_dict(), 4, 2))
    tokens = torch.randint(0, 128, (2, 10))
    positions = torch.arange(10).expand(2, 10)
    torch.testing.assert_close(fused(tokens, positions), plain(tokens, positions))
    q, k, v = split_qkv(fused.state_dict()["layers.0.attention.wqkv.weight"], 4, 2)
    assert torch.equal(q, plain.state_dict()["layers.0.attention.wq.weight"])
    assert torch.equal(v, plain.state_dict()["layers.0.attention.wv.weight"])


def test_mixtral_routing_is_megatrons_default_top_k():
    """softmax over all experts, top 2, renormalised == softmax over the top-2 logits (pre_softmax off)."""
    logits = torch.randn(50, 8, generator=torch.Generator().manual_seed(3))
    routing = route(logits, 2, pre_softmax=False)
    probs = torch.softmax(logits, dim=-1)
    top, experts = torch.topk(probs, 2, dim=-1)
    assert torch.equal(routing.experts, experts)
    torch.testing.assert_close(routing.weights, top / top.sum(dim=-1, keepdim=True))


# -- GPT-2 unchanged --------------------------------------------------------------------------------------------
def test_gpt2_keeps_its_names_and_model_config_keys(tmp_path):
    names = [name for name, _ in GPT(GPT2_SHAPE).named_parameters()]
    assert names[:2] == ["tok_embeddings.weight", "pos_embeddings.weight"]
    assert names[2:2 + len(GPT2_BLOCK_NAMES)] == [f"layers.0.{n}" for n in GPT2_BLOCK_NAMES]
    assert names[-2:] == ["norm.weight", "norm.bias"]  # the head is tied: not a parameter of its own
    save_model_config(tmp_path, CheckpointModel(GPT2_SHAPE, 100, 99))
    written = json.loads((tmp_path / "model_config.json").read_text())["shape"]
    assert set(written) == GPT2_SHAPE_KEYS
    assert read_model_config(tmp_path).shape == GPT2_SHAPE


def test_llama_options_round_trip_model_config(tmp_path):
    save_model_config(tmp_path, CheckpointModel(LLAMA_SHAPE, 100, 99))
    assert read_model_config(tmp_path).shape == LLAMA_SHAPE


def test_the_flags_build_the_shape():
    """Megatron's spellings, --norm-epsilon the alias of --layernorm-epsilon."""
    argv = ["--dataset", "p", "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
            "--normalization", "RMSNorm", "--norm-epsilon", "1e-6", "--swiglu", "--position-embedding-type", "rope",
            "--rotary-base", "500000", "--rotary-percent", "0.5", "--use-rope-scaling", "--rope-scaling-factor", "16",
            "--group-query-attention", "--num-query-groups", "2", "--kv-channels", "32", "--disable-bias-linear",
            "--add-qkv-bias", "--qk-layernorm", "--untie-embeddings-and-output-weights", "--apply-layernorm-1p",
            "--rotary-seq-len-interpolation-factor", "2", "--seq-length", "32", "--vocab-size", "100"]
    config = config_from_args(build_parser().parse_args(argv))
    shape = model_shape(config, 100, 1)
    assert shape.layernorm_epsilon == 1e-6 and shape.normalization == "RMSNorm" and shape.swiglu
    assert shape.ffn_hidden_size == 128 and shape.rotary_base == 500000 and shape.rotary_percent == 0.5
    assert shape.rope_scaling_factor == 16 and shape.rotary_interpolation_factor == 2
    assert (shape.num_query_groups, shape.head_dim, shape.add_bias_linear, shape.add_qkv_bias) == (2, 32, False, True)
    assert shape.qk_layernorm and shape.untie_embeddings_and_output_weights and shape.apply_layernorm_1p
    plain = model_shape(config_from_args(build_parser().parse_args(["--dataset", "p"])), 100, 1)
    defaults = {f.name: f.default for f in dataclasses.fields(GPTShape)}
    assert all(getattr(plain, name) == defaults[name] for name in DECODER_OPTIONS), "no flag: GPT-2"


# -- refusals --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("argv", "expected"), [
    (["--group-query-attention", "--num-query-groups", "3", "--num-attention-heads", "6", "--hidden-size", "48",
      "--tensor-model-parallel-size", "2", "--num-gpus-per-node", "2"],
     "--num-query-groups (3) is not divisible by --tensor-model-parallel-size (2)"),
    (["--group-query-attention", "--num-query-groups", "5"],
     "--num-attention-heads (12) is not divisible by --num-query-groups (5)"),
    (["--num-query-groups", "2"], "--num-query-groups (2) needs --group-query-attention"),
    (["--no-position-embedding"],
     "--no-position-embedding is deprecated: use --position-embedding-type none (or rope)"),
    (["--model", "t5", "--swiglu", "--normalization", "RMSNorm"], "--normalization, --swiglu do not apply to model t5"),
    (["--model", "bert", "--qk-layernorm"], "--qk-layernorm does not apply to model bert"),
    (["--model", "bert", "--untie-embeddings-and-output-weights"],
     "--untie-embeddings-and-output-weights does not apply to model bert"),
    (["--rotary-percent", "1.5"], "--rotary-percent must be in (0, 1], got 1.5"),
])
def test_a_bad_combination_is_one_line(argv, expected, capsys):
    assert main(["--dataset", "p", "--device", "cpu", *argv]) != 0
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert lines == [f"train: error: {expected}"]
    assert "Traceback" not in err
