"""``train --num-experts N`` (GPT) and ``train --model t5 --num-experts N``: the families' MLPs become MoE
layers, the auxiliary losses train the router and are logged with the dropped fraction and expert loads;
DeepSpeed's and Megatron's flag spellings both work."""

import dataclasses
import json

import pytest
import torch
from trainer_testing import argv_for, t5_config, tiny_config

from trainer.cli.train import main
from trainer.cli.train_args import build_parser, config_from_args
from trainer.config import MoEConfig
from trainer.moe.experts import cpu_grouped_mm_available, log_backend
from trainer.train import train

MOE_KEYS = {"moe_aux_loss", "moe_z_loss", "moe_dropped_fraction", "moe_max_expert_load", "moe_min_expert_load"}
STEPS = 2


def parse(argv):
    return config_from_args(build_parser().parse_args(argv))


def train_records(path):
    return [r for r in map(json.loads, path.read_text().splitlines()) if "split" not in r]


def test_deepspeed_and_megatron_spellings_give_the_same_config():
    deepspeed = parse(["--moe", "--moe_num_experts", "8", "--moe_ep_size", "2", "--moe-loss-coeff", "0.01"]).moe
    megatron = parse(["--num-experts", "8", "--expert-model-parallel-size", "2", "--moe-aux-loss-coeff", "0.01"]).moe
    assert dataclasses.replace(deepspeed, moe=False) == megatron
    assert (megatron.num_experts, megatron.expert_model_parallel_size, megatron.moe_aux_loss_coeff) == (8, 2, 0.01)
    assert parse(["--num-experts", "4", "--moe-router-topk", "1", "--moe-expert-capacity-factor", "1.25",
                  "--moe-layer-freq", "2", "--moe-router-pre-softmax", "--moe-z-loss-coeff", "0.001",
                  "--moe-input-jitter-eps", "0.01"]).moe == MoEConfig(
        num_experts=4, moe_router_topk=1, moe_expert_capacity_factor=1.25, moe_layer_freq=2,
        moe_router_pre_softmax=True, moe_z_loss_coeff=0.001, moe_input_jitter_eps=0.01)


@pytest.mark.parametrize(("argv", "message"), [
    (["--moe"], "--moe needs --num-experts"),
    (["--num-experts", "2", "--moe-router-topk", "3"], "--moe-router-topk must be in [1, 2], got 3"),
    (["--moe_ep_size", "2"], "--expert-model-parallel-size (2) needs --num-experts"),
])
def test_bad_moe_flags_fail_with_one_line(argv, message, capsys):
    assert main(["--dataset", "p", *argv]) != 0
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], lines


@pytest.mark.timeout(300)
def test_gpt_trains_with_experts_and_logs_the_auxiliary_losses(tiny_prefix, cache_dir, tmp_path, caplog):
    config = tiny_config(tiny_prefix, cache_dir, num_layers=2, train_iters=STEPS)
    argv = [a for a in argv_for(config) if a not in ("--metrics-file", config.logging.metrics_file)]
    argv += ["--num-experts", "4", "--moe-router-topk", "1", "--moe-aux-loss-coeff", "0.01",
             "--moe-z-loss-coeff", "0.001", "--moe-expert-capacity-factor", "1.0", "--log-interval", "1",
             "--metrics-file", str(tmp_path / "metrics.jsonl")]
    log_backend.cache_clear()  # logged once per process: make this run log it
    with caplog.at_level("INFO"):
        assert main(argv) == 0
    records = train_records(tmp_path / "metrics.jsonl")
    assert len(records) == STEPS and all(MOE_KEYS <= set(r) for r in records)
    for r in records:
        assert 0.0 < r["moe_dropped_fraction"] < 1.0  # capacity 1.0 on an untrained router drops some
        assert r["moe_min_expert_load"] <= 1.0 <= r["moe_max_expert_load"]
        assert r["moe_aux_loss"] == pytest.approx(0.01, rel=0.5)  # coefficient x ~1 (balanced is exactly 1)
    log = caplog.text
    assert "| moe_aux_loss: " in log and "| moe_dropped_fraction: " in log
    # The CPU path: torch's own grouped GEMM (torch 2.9+) or our per-expert one, as the log says.
    cpu_path = "grouped_mm grouped GEMM (torch._grouped_mm on the CPU" if cpu_grouped_mm_available(torch.float32) \
        else "segmented grouped GEMM"
    assert f"MoE experts: {cpu_path}" in log


@pytest.mark.timeout(300)
def test_t5_trains_with_experts_on_every_other_layer(sentence_prefix, data_test, cache_dir, tmp_path):
    config = t5_config(sentence_prefix, data_test, cache_dir, train_iters=STEPS)
    argv = [a for a in argv_for(config) if a not in ("--metrics-file", config.logging.metrics_file)]
    argv += ["--moe", "--moe_num_experts", "4", "--moe-layer-freq", "2", "--moe-loss-coeff", "0.01",
             "--log-interval", "1", "--metrics-file", str(tmp_path / "metrics.jsonl")]
    assert main(argv) == 0
    records = train_records(tmp_path / "metrics.jsonl")
    assert len(records) == STEPS and all(MOE_KEYS <= set(r) for r in records)
    assert all(r["moe_dropped_fraction"] == 0.0 for r in records)  # dropless


def test_t5_moe_layers_replace_the_mlp_of_the_chosen_layers_of_each_stack():
    from trainer.models.t5.model import T5, T5Shape
    from trainer.moe.settings import MoESettings

    import torch

    with torch.device("meta"):
        model = T5(T5Shape(vocab_size=64, d_model=16, d_kv=4, d_ff=32, num_heads=4, num_encoder_layers=3,
                           num_decoder_layers=2, feed_forward="gated-gelu", moe=MoESettings(num_experts=4, layer_freq=2)))
    names = {name for name, _ in model.named_parameters()}
    assert {"encoder_layers.0.feed_forward.router.weight", "encoder_layers.2.feed_forward.experts.w3.weight",
            "decoder_layers.0.feed_forward.experts.w1.weight"} <= names
    assert "encoder_layers.1.feed_forward.w1.weight" in names and "decoder_layers.1.feed_forward.w2.weight" in names
    assert dict(model.named_parameters())["encoder_layers.0.feed_forward.experts.w2.weight"].shape == (4, 32, 16)


@pytest.mark.timeout(300)
def test_activation_checkpointing_gives_the_same_losses_and_metrics(tiny_prefix, cache_dir):
    """Recomputing a MoE layer in the backward pass neither counts its metrics twice nor changes a number."""
    base = dataclasses.replace(tiny_config(tiny_prefix, cache_dir, num_layers=2, train_iters=STEPS),
                               moe=MoEConfig(num_experts=4, moe_aux_loss_coeff=0.01, moe_expert_capacity_factor=1.0))
    plain = train(base)
    recomputed = train(dataclasses.replace(base, training=dataclasses.replace(base.training,
                                                                              checkpoint_activations=True)))
    assert recomputed.losses == pytest.approx(plain.losses, abs=1e-6)
    for got, want in zip(recomputed.auxiliary, plain.auxiliary, strict=True):
        assert got == pytest.approx(want)


def test_a_family_without_an_expert_variant_refuses_num_experts_instead_of_training_dense():
    from trainer.errors import TrainConfigError
    from trainer.models.gpt.model import GPTShape
    from trainer.moe.settings import check_family_has_experts

    @dataclasses.dataclass(frozen=True)
    class DenseOnlyShape:
        hidden_size: int = 8

    with pytest.raises(TrainConfigError, match=r"num_experts \(4\): model bert has no mixture-of-experts variant"):
        check_family_has_experts(4, DenseOnlyShape(), "bert")
    check_family_has_experts(None, DenseOnlyShape(), "bert")  # no experts asked: nothing to refuse
    check_family_has_experts(4, GPTShape(1, 8, 2, 16, 8, 64), "gpt")
