"""MoE checkpoints in the tools besides ``train``: ``model_config.json`` records the experts, so ``train --load``
takes them as defaults, ``generate`` builds the MoE model, and ``convert-checkpoint --to-hf`` exports what
Hugging Face can express (a T5 with Switch routing) and refuses the rest in one line."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from trainer.checkpoint.save import save_checkpoint
from trainer.checkpoint.store import MODEL_CONFIG_FILE, MODEL_PREFIX
from trainer.cli.train import _parser_for
from trainer.cli.train_args import config_from_args
from trainer.models.gpt.convert import CheckpointModel, read_model_config, save_model_config
from trainer.models.gpt.model import GPT, GPTShape
from trainer.models.t5.convert import read_t5_model_config, save_t5_model_config
from trainer.models.t5.model import T5, T5Shape
from trainer.models.t5.settings import t5_settings
from trainer.moe.settings import MoESettings

GPT_MOE = MoESettings(num_experts=4, top_k=2, aux_loss_coeff=0.01, z_loss_coeff=0.001, layer_freq=2,
                      input_jitter_eps=0.01)
GPT_SHAPE = GPTShape(num_layers=3, hidden_size=16, num_attention_heads=2, ffn_hidden_size=32,
                     max_position_embeddings=32, padded_vocab_size=64, moe=GPT_MOE)
T5_MOE = MoESettings(num_experts=4, top_k=2, capacity_factor=1.25, layer_freq=2)
T5_SHAPE = T5Shape(vocab_size=64, d_model=16, d_kv=4, d_ff=32, num_heads=4, num_encoder_layers=2, num_decoder_layers=2,
                   feed_forward="gated-gelu", moe=T5_MOE)
VOCAB, EOD = 60, 59


def save_model(root, model: torch.nn.Module) -> None:
    torch.manual_seed(0)
    with torch.no_grad():
        for param in model.parameters():
            param.normal_(0.0, 0.5)
    save_checkpoint(root, 1, {MODEL_PREFIX + name: p.detach() for name, p in model.named_parameters()})


@pytest.fixture
def gpt_checkpoint(tmp_path):
    root = tmp_path / "gpt"
    save_model_config(root, CheckpointModel(GPT_SHAPE, VOCAB, EOD))
    save_model(root, GPT(GPT_SHAPE))
    return root


def load_defaults(root) -> dict:
    argv = ["--dataset", "p", "--load", str(root)]
    return config_from_args(_parser_for(argv).parse_args(argv))


def test_gpt_model_config_keeps_the_experts(gpt_checkpoint):
    saved = json.loads((gpt_checkpoint / MODEL_CONFIG_FILE).read_text())
    assert saved["shape"]["moe"]["num_experts"] == 4
    assert read_model_config(gpt_checkpoint).shape == GPT_SHAPE


def test_train_load_takes_a_gpt_checkpoints_experts_as_defaults(gpt_checkpoint):
    config = load_defaults(gpt_checkpoint)
    assert (config.model.num_layers, config.model.ffn_hidden_size) == (3, 32)
    moe = config.moe
    assert (moe.num_experts, moe.moe_router_topk, moe.moe_aux_loss_coeff, moe.moe_z_loss_coeff, moe.moe_layer_freq,
            moe.moe_input_jitter_eps, moe.moe_expert_capacity_factor) == (4, 2, 0.01, 0.001, 2, 0.01, None)


def test_generate_builds_the_moe_gpt_of_a_checkpoint(gpt_checkpoint, capsys):
    from trainer.checkpoint.load import load_checkpoint
    from trainer.cli.generate import main

    prompt = [3, 7, 11, 5]
    assert main(["--load", str(gpt_checkpoint), "--prompt-ids", " ".join(map(str, prompt)), "--greedy", "--json",
                 "--max-new-tokens", "5", "--device", "cpu"]) == 0
    [record] = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    model = GPT(GPT_SHAPE).eval()
    state = {MODEL_PREFIX + name: p.detach() for name, p in model.named_parameters()}
    load_checkpoint(gpt_checkpoint, 1, state)
    tokens = list(prompt)
    with torch.no_grad():  # dropless: the full forward's greedy tokens are the cached decoding's
        for _ in range(5):
            logits = model(torch.tensor([tokens]), torch.arange(len(tokens))[None])[0, -1, :VOCAB]
            tokens.append(int(logits.argmax()))
            if tokens[-1] == EOD:
                break
    assert record["ids"] == tokens[len(prompt):]


def test_exporting_a_moe_gpt_is_refused_in_one_line(gpt_checkpoint, tmp_path, capsys):
    from trainer.cli.convert import main

    assert main(["--from", str(gpt_checkpoint), "--to-hf", str(tmp_path / "out")]) != 0
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "holds a mixture-of-experts GPT (4 experts), which Hugging Face GPT-2 cannot" in lines[0]
    assert not (tmp_path / "out" / "config.json").exists()


def test_t5_model_config_keeps_the_experts_and_train_load_takes_them(tmp_path):
    root = tmp_path / "t5"
    save_t5_model_config(root, T5_SHAPE, VOCAB, 1, 0, "t5")
    info = read_t5_model_config(root)
    assert info["shape"] == T5_SHAPE
    assert info["model_type"] == "switch_transformers"  # a T5 with experts exports as Switch Transformers
    save_model(root, T5(T5_SHAPE))
    config = load_defaults(root)
    assert (config.model.model, t5_settings(config).feed_forward_proj) == ("t5", "gated-gelu")
    assert (config.moe.num_experts, config.moe.moe_router_topk, config.moe.moe_expert_capacity_factor,
            config.moe.moe_layer_freq) == (4, 2, 1.25, 2)


def test_exporting_a_t5_with_non_switch_experts_is_refused_in_one_line(tmp_path, capsys):
    from trainer.cli.convert import main

    root = tmp_path / "t5"
    save_t5_model_config(root, dataclasses.replace(T5_SHAPE, feed_forward="relu"), VOCAB, 1, 0, "t5")
    save_model(root, T5(dataclasses.replace(T5_SHAPE, feed_forward="relu")))
    assert main(["--from", str(root), "--to-hf", str(tmp_path / "out")]) != 0
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "Switch Transformers route top-1 of the softmax over all experts" in lines[0], lines


def test_a_malformed_moe_entry_names_the_file(tmp_path):
    from trainer.errors import CheckpointError

    root = tmp_path / "gpt"
    save_model_config(root, CheckpointModel(GPT_SHAPE, VOCAB, EOD))
    path = root / MODEL_CONFIG_FILE
    value = json.loads(path.read_text())
    value["shape"]["moe"]["top_k"] = 3
    path.write_text(json.dumps(value))
    with pytest.raises(CheckpointError, match=r"model_config.json: shape.moe.top_k=3: must be in \[1, 2\]"):
        read_model_config(root)


def test_layer_offset_and_per_sequence_capacity():
    from trainer.moe.dispatch import capacity_keep_mask

    settings = MoESettings(num_experts=2, top_k=1, layer_freq=2, layer_offset=1)
    assert [settings.is_moe_layer(i) for i in range(5)] == [False, True, False, True, False]
    experts = torch.tensor([[0], [0], [1], [0], [0], [0]])  # two sequences of three tokens
    assert capacity_keep_mask(experts, 2, 1, groups=2).flatten().tolist() == [True, False, True, True, False, False]
    assert capacity_keep_mask(experts, 2, 1).flatten().tolist() == [True, False, True, False, False, False]
    with pytest.raises(ValueError, match="capacity_factor .* and expert_capacity .* exclude each other"):
        MoESettings(num_experts=2, capacity_factor=1.0, expert_capacity=2)
