"""Hugging Face Switch Transformers (the T5 with experts) in and out: an imported model gives transformers'
logits and greedy tokens (also when expert capacity drops tokens), ``convert-checkpoint`` round-trips it,
``train --load-hf`` takes its experts as defaults, and what Switch cannot express is refused in one line.

The oracles are tiny random ``SwitchTransformersForConditionalGeneration``s made locally (nothing
downloaded), their weights drawn from our own seeded generator (`hf_testing.seed_weights`).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from hf_testing import seed_weights
from test_t5_hf import EOS, PAD, VOCAB, batch  # the T5 oracle tests' inputs: 3 x 11 encoder ids (one padded), 3 x 6 decoder

from trainer.errors import HFConversionError
from trainer.checkpoint.hf_files import read_hf_config, write_json
from trainer.models.t5.generate import greedy_generate
from trainer.models.t5.hf import load_hf_t5, save_hf_t5
from trainer.moe.layer import DROPPED_FRACTION, MoELayer
from trainer.moe.settings import MoESettings

TINY = dict(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=48, num_heads=4, num_layers=2, num_decoder_layers=2,
            num_experts=4, relative_attention_num_buckets=8, relative_attention_max_distance=20, dropout_rate=0.0)
# Switch's sparse layers: every other one (layers 1 of each stack; step 2), or all (step 1).
EVERY_OTHER, EVERY = 1, 2
# A capacity no 11-token sequence reaches, and one that drops tokens of these batches.
LARGE_CAPACITY, SMALL_CAPACITY = 64, 3
# Each expert MLP multiplies its input's rounding errors by about std^2 sqrt(d_model d_ff): at 0.5 the ulp-level
# differences of two fp32 implementations reach 3e-5 of the largest logit through 4 MoE layers (measured;
# transformers' own fp32 and fp64 runs differ by 1e-4 there); at 0.3 they stay near 1e-6.
WEIGHT_STD = 0.3
LOGIT_RTOL = 1e-5


def make_switch(directory: Path, sparse_layers: int = EVERY_OTHER, capacity: int = LARGE_CAPACITY,
                seed: int = 0) -> Path:
    from transformers import SwitchTransformersConfig, SwitchTransformersForConditionalGeneration

    config = SwitchTransformersConfig(num_sparse_encoder_layers=sparse_layers, num_sparse_decoder_layers=sparse_layers,
                                      expert_capacity=capacity, **TINY)
    seed_weights(SwitchTransformersForConditionalGeneration(config), seed, WEIGHT_STD).save_pretrained(directory)
    return directory


def hf_switch(directory: Path):
    from transformers import SwitchTransformersForConditionalGeneration

    return SwitchTransformersForConditionalGeneration.from_pretrained(directory).eval()


def dropped_fraction(model, *inputs) -> tuple[float, torch.Tensor]:
    """The fraction of token-expert assignments ``model`` drops on ``inputs``, and its logits. The layers record
    it in training forwards only: this one runs in training mode with the input jitter off (the tiny model has
    no dropout), so it routes as the evaluation forward does."""
    layers = [m for m in model.modules() if isinstance(m, MoELayer)]
    for layer in layers:
        layer.settings = dataclasses.replace(layer.settings, input_jitter_eps=None)
    with torch.no_grad():
        logits = model.train()(*inputs)
    model.eval()
    records = [layer.pop_auxiliary_metrics()[DROPPED_FRACTION] for layer in layers]
    return sum(r.value for r in records) / sum(r.weight for r in records), logits


def test_switch_config_becomes_top1_pre_softmax_experts_on_switch_layers(tmp_path):
    model = load_hf_t5(make_switch(tmp_path / "switch"))
    assert model.shape.moe == MoESettings(num_experts=4, top_k=1, pre_softmax=True, aux_loss_coeff=0.001,
                                          z_loss_coeff=0.001, expert_capacity=LARGE_CAPACITY, layer_freq=2,
                                          layer_offset=1, input_jitter_eps=0.01)
    assert (model.shape.feed_forward, model.shape.tie_word_embeddings, model.shape.scale_decoder_outputs) == (
        "relu", True, True)
    assert isinstance(model.encoder_layers["1"].feed_forward, MoELayer)
    assert not isinstance(model.decoder_layers["0"].feed_forward, MoELayer)


@pytest.mark.parametrize(("sparse_layers", "capacity"), [(EVERY_OTHER, LARGE_CAPACITY), (EVERY, SMALL_CAPACITY)])
def test_imported_switch_gives_hf_logits_also_when_capacity_drops_tokens(tmp_path, sparse_layers, capacity):
    directory = make_switch(tmp_path / "switch", sparse_layers, capacity)
    model, reference = load_hf_t5(directory).eval(), hf_switch(directory)
    encoder, mask, decoder = batch()
    with torch.no_grad():
        ours = model(encoder, decoder, mask)
        theirs = reference(input_ids=encoder, attention_mask=mask, decoder_input_ids=decoder).logits
    torch.testing.assert_close(ours, theirs, atol=LOGIT_RTOL * theirs.abs().max().item(), rtol=0)
    dropped, logits = dropped_fraction(model, encoder, decoder, mask)
    torch.testing.assert_close(logits, ours, atol=0, rtol=0)
    assert (dropped > 0.1) if capacity == SMALL_CAPACITY else dropped == 0.0


@pytest.mark.parametrize("use_cache", [True, False])
def test_greedy_generation_matches_hf_token_for_token(tmp_path, use_cache):
    """Without a cache both sides re-run the decoder's whole sequence at each step, so its capacity counts
    every position; with one, only the new position (transformers' behaviour, matched)."""
    directory = make_switch(tmp_path / "switch", EVERY, SMALL_CAPACITY, seed=3)
    model, reference = load_hf_t5(directory).eval(), hf_switch(directory)
    encoder, mask, _ = batch(seed=4)
    kwargs = dict(attention_mask=mask, use_cache=use_cache, max_new_tokens=12)
    ours = greedy_generate(model, encoder, decoder_start_id=PAD, eos_id=EOS, pad_id=PAD,
                           encoder_attention_mask=kwargs.pop("attention_mask"), **kwargs)
    with torch.no_grad():
        theirs = reference.generate(input_ids=encoder, attention_mask=mask, do_sample=False,
                                    decoder_start_token_id=PAD, **kwargs)
    assert ours.tolist() == theirs.tolist()
    assert len(set(ours[:, 1:].flatten().tolist())) > 3, "the greedy output should be varied"


def test_generate_command_on_a_switch_directory_matches_hf_greedy(tmp_path, capsys):
    from trainer.cli.generate import main

    directory = make_switch(tmp_path / "switch", EVERY, SMALL_CAPACITY)
    prompts = [[5, 17, 42, 99, 3, 64, 12], [120, 7, 64], [8, 150, 33, 21, 77, 190, 2, 9, 11]]
    prompt_flags = [flag for prompt in prompts for flag in ("--prompt-ids", " ".join(map(str, prompt)))]
    assert main(["--load", str(directory), "--greedy", "--json", "--max-new-tokens", "8", "--device", "cpu",
                 *prompt_flags]) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    reference = hf_switch(directory)
    for record, prompt in zip(records, prompts, strict=True):
        with torch.no_grad():
            expected = reference.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=8,
                                          decoder_start_token_id=PAD)[0, 1:].tolist()
        assert record["ids"] == expected


def test_convert_checkpoint_round_trips_switch_exactly(tmp_path):
    from trainer.cli.convert import main
    from trainer.models.t5.convert import read_t5_model_config

    directory = make_switch(tmp_path / "switch", EVERY_OTHER, SMALL_CAPACITY)
    assert main(["--from-hf", str(directory), "--to", str(tmp_path / "ckpt")]) == 0
    info = read_t5_model_config(tmp_path / "ckpt")
    assert info["model_type"] == "switch_transformers"
    assert info["shape"].moe == load_hf_t5(directory).shape.moe  # model_config.json keeps the experts
    assert main(["--from", str(tmp_path / "ckpt"), "--to-hf", str(tmp_path / "back")]) == 0
    config = read_hf_config(tmp_path / "back")
    assert (config["model_type"], config["num_sparse_encoder_layers"], config["expert_capacity"]) == (
        "switch_transformers", 1, SMALL_CAPACITY)
    encoder, mask, decoder = batch()
    with torch.no_grad():
        want = hf_switch(directory)(input_ids=encoder, attention_mask=mask, decoder_input_ids=decoder).logits
        got = hf_switch(tmp_path / "back")(input_ids=encoder, attention_mask=mask, decoder_input_ids=decoder).logits
    assert torch.equal(got, want)


def test_load_hf_takes_the_experts_as_defaults_and_refuses_other_experts(tmp_path):
    from trainer.cli.train import _parser_for
    from trainer.cli.train_args import config_from_args
    from trainer.errors import CheckpointError
    from trainer.models.t5.convert import load_hf_t5_weights
    from trainer.models.t5.model import T5

    directory = make_switch(tmp_path / "switch", EVERY_OTHER, SMALL_CAPACITY)
    argv = ["--dataset", "p", "--load-hf", str(directory)]
    moe = config_from_args(_parser_for(argv).parse_args(argv)).moe
    assert (moe.num_experts, moe.moe_router_topk, moe.moe_router_pre_softmax, moe.moe_expert_capacity,
            moe.moe_layer_freq, moe.moe_layer_offset, moe.moe_input_jitter_eps) == (4, 1, True, SMALL_CAPACITY, 2, 1, 0.01)
    shape = load_hf_t5(directory).shape
    with torch.device("meta"):
        other = T5(dataclasses.replace(shape, moe=dataclasses.replace(shape.moe, layer_offset=0)))
    with pytest.raises(CheckpointError, match=r"the model has experts 4 per MoE layer, every 2 layer\(s\) from layer 1 "
                                              r"but the run asks for 4 per MoE layer, every 2 layer\(s\) from layer 0"):
        load_hf_t5_weights(list(other.named_parameters()), directory, other.shape)


@pytest.mark.parametrize(("change", "message"), [
    ({"router_dtype": "bfloat16"}, "router_dtype 'bfloat16' is not supported"),
    ({"router_bias": True}, "router_bias true is not supported"),
    ({"num_sparse_decoder_layers": 2}, "encoder and decoder sparse steps differ (2 and 1)"),
    ({"dense_act_fn": "gelu"}, "dense_act_fn 'gelu' is not supported"),
])
def test_import_refuses_a_router_it_would_compute_differently(tmp_path, change, message):
    directory = make_switch(tmp_path / "switch")
    write_json(directory / "config.json", {**read_hf_config(directory), **change})
    with pytest.raises(HFConversionError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_hf_t5(directory)


@pytest.mark.parametrize(("moe", "message"), [
    (MoESettings(num_experts=4, top_k=2, pre_softmax=True), "route top-1 of the softmax over all experts"),
    (MoESettings(num_experts=4, top_k=1, pre_softmax=True, capacity_factor=1.0), "capacity factor 1.0 has no"),
    (MoESettings(num_experts=4, top_k=1, pre_softmax=True, layer_freq=2), "MoE layers [0] of the encoder cannot"),
])
def test_export_refuses_what_switch_cannot_express(tmp_path, moe, message):
    from trainer.models.t5.model import T5

    model = load_hf_t5(make_switch(tmp_path / "switch"))
    with torch.device("meta"):
        other = T5(dataclasses.replace(model.shape, moe=moe))
    with pytest.raises(HFConversionError, match=message.replace("[", r"\[").replace("]", r"\]")):
        save_hf_t5(other, tmp_path / "out", model_type="switch_transformers")


def test_a_dropless_t5_with_experts_exports_with_an_unreachable_capacity(tmp_path):
    from trainer.models.t5.model import T5

    shape = dataclasses.replace(load_hf_t5(make_switch(tmp_path / "switch")).shape,
                                moe=MoESettings(num_experts=4, top_k=1, pre_softmax=True, layer_freq=2, layer_offset=1))
    torch.manual_seed(0)
    model = T5(shape).eval()
    save_hf_t5(model, tmp_path / "out", model_type="switch_transformers")
    encoder, mask, decoder = batch()
    with torch.no_grad():
        theirs = hf_switch(tmp_path / "out")(input_ids=encoder, attention_mask=mask, decoder_input_ids=decoder).logits
        torch.testing.assert_close(model(encoder, decoder, mask), theirs,
                                   atol=LOGIT_RTOL * theirs.abs().max().item(), rtol=0)
