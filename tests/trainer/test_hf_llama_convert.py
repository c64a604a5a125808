"""Hugging Face Llama-class directories <-> tokenmill GPT checkpoints (issue 30, point 3).

For LlamaForCausalLM (Llama 2 shapes with linear rope scaling; Llama 3.x with GQA and its rope_scaling),
MistralForCausalLM (multi-query), Qwen2ForCausalLM (q/k/v biases, tied embeddings), Qwen3ForCausalLM (q/k
norms, head_dim != hidden / heads) and MixtralForCausalLM (experts stacked into our [E, in, out] layout), on
tiny models built by transformers and filled from our own seeded generator, as a user types it
(``convert-checkpoint --from-hf DIR --to ROOT``, ``--from ROOT --to-hf OUT``):

- the imported checkpoint's logits are transformers' within 1e-5 of the largest logit, with a vocabulary
  padded for tensor parallelism;
- the export holds the same tensors under the same names, its config is the same architecture, and
  transformers reloads it with the same logits;
- Llama's tokenizer files (tokenizer.json, tokenizer_config.json, special_tokens_map.json, tokenizer.model)
  are carried into the checkpoint and out again byte for byte;
- a config with a feature we do not implement is refused in one line naming the field, and nothing is written.
"""

from __future__ import annotations

import json

import pytest
import torch
from hf_llama_testing import (
    LLAMA_TOKENIZER_FILES,
    VARIANTS,
    add_tokenizer_files,
    hf_llama,
    make_tiny_llama,
    max_logit_tolerance,
)
from hf_testing import TINY_VOCAB, prompt_batch

from trainer.checkpoint.hf_files import read_hf_weights
from trainer.cli.convert import main
from trainer.models.gpt.convert import checkpoint_model, read_checkpoint_state
from trainer.models.gpt.model import GPT

RELATIVE_TOLERANCE = 1e-5
SEQUENCE = 24


@pytest.fixture(scope="module", params=list(VARIANTS))
def converted(request, tmp_path_factory):
    """(variant, HF directory with tokenizer files, imported checkpoint, exported directory)."""
    workdir = tmp_path_factory.mktemp(request.param)
    source = make_tiny_llama(workdir / "hf", request.param)
    tokenizer = add_tokenizer_files(source)
    assert main(["--from-hf", str(source), "--to", str(workdir / "ckpt"), "--make-vocab-size-divisible-by", "64",
                 "--tensor-model-parallel-size", "2"]) == 0
    assert main(["--from", str(workdir / "ckpt"), "--to-hf", str(workdir / "out")]) == 0
    return request.param, source, tokenizer, workdir / "ckpt", workdir / "out"


def tokens() -> torch.Tensor:
    return torch.tensor(prompt_batch((SEQUENCE,) * 3, seed=7))


def test_imported_checkpoint_gives_transformers_logits(converted):
    _, source, _, checkpoint, _ = converted
    root, iteration, info = checkpoint_model(checkpoint)
    assert (info.vocab_size, info.shape.padded_vocab_size) == (TINY_VOCAB, 384)
    model = GPT(info.shape).eval()
    model.load_state_dict(read_checkpoint_state(root, iteration, info.shape), strict=False)
    batch = tokens()
    with torch.no_grad():
        want = hf_llama(source)(batch).logits
        got = model(batch, torch.arange(SEQUENCE).expand_as(batch))[..., :TINY_VOCAB]
    assert torch.allclose(got, want, rtol=0, atol=max_logit_tolerance(want, RELATIVE_TOLERANCE))


def test_export_is_the_same_model_in_transformers(converted):
    variant, source, _, _, exported = converted
    original, written = read_hf_weights(source), read_hf_weights(exported)
    assert written.keys() == original.keys()
    for name, tensor in original.items():
        assert torch.equal(written[name], tensor.float()), name
    config, theirs = (json.loads((d / "config.json").read_text()) for d in (exported, source))
    assert config["architectures"] == [VARIANTS[variant][1]] and config["model_type"] == theirs["model_type"]
    batch = tokens()
    with torch.no_grad():
        assert torch.equal(hf_llama(exported)(batch).logits, hf_llama(source)(batch).logits)


def test_tokenizer_files_are_carried_through(converted):
    _, _, tokenizer, checkpoint, exported = converted
    for name in LLAMA_TOKENIZER_FILES:
        assert (checkpoint / name).read_bytes() == tokenizer[name], name
        assert (exported / name).read_bytes() == tokenizer[name], name


# variant, config change, what the one error line must name.
REFUSED = [
    ("mistral", {"sliding_window": 16}, "sliding_window=16"),
    ("qwen2", {"use_sliding_window": True, "sliding_window": 32}, "sliding_window=32"),
    ("llama3", {"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope_type 'yarn'"),
    ("llama2", {"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, "rope_type 'dynamic'"),
    ("llama2", {"hidden_act": "gelu"}, "hidden_act 'gelu'"),
    ("llama2", {"attention_bias": True}, "attention_bias=true"),
    ("llama2", {"num_key_value_heads": 3}, "num_key_value_heads=3"),
    ("mixtral", {"num_experts_per_tok": 3}, "num_experts_per_tok=3"),
    ("llama2", {"quantization_config": {"quant_method": "gptq"}}, "quantization_config"),
    ("qwen3", {"eos_token_id": TINY_VOCAB}, f"eos_token_id={TINY_VOCAB}"),
]


@pytest.mark.parametrize("variant, change, named", REFUSED)
def test_unsupported_features_are_refused_in_one_line(tmp_path, capsys, variant, change, named):
    source = make_tiny_llama(tmp_path / "hf", "llama2" if variant == "llama2" else variant)
    config = json.loads((source / "config.json").read_text())
    config.update(change)
    if "rope_scaling" in change:  # transformers 5 writes rope_parameters, which win over rope_scaling
        config.pop("rope_parameters", None)
    (source / "config.json").write_text(json.dumps(config))
    before = sorted(p.name for p in tmp_path.iterdir())
    capsys.readouterr()  # transformers' save_pretrained progress bar
    assert main(["--from-hf", str(source), "--to", str(tmp_path / "ckpt")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith("convert-checkpoint: error: ") and str(source / "config.json") in err and named in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_missing_expert_is_named(tmp_path, capsys):
    import safetensors.torch

    source = make_tiny_llama(tmp_path / "hf", "mixtral")
    weights = safetensors.torch.load_file(source / "model.safetensors")
    weights.pop("model.layers.1.block_sparse_moe.experts.3.w2.weight")
    safetensors.torch.save_file(weights, source / "model.safetensors", metadata={"format": "pt"})
    assert main(["--from-hf", str(source), "--to", str(tmp_path / "ckpt")]) == 1
    assert "missing tensor model.layers.1.block_sparse_moe.experts.3.w2.weight" in capsys.readouterr().err


def test_zero_centred_norms_are_converted_both_ways(tmp_path):
    """A run with --apply-layernorm-1p stores norm weights less one: loaded and exported as the same model."""
    import dataclasses

    from trainer.checkpoint.hf_files import read_hf_config
    from trainer.models.gpt.hf_decoders import decoder_shape, decoder_state, export_decoder

    source = make_tiny_llama(tmp_path / "hf", "qwen3")
    config, original = read_hf_config(source), read_hf_weights(source)
    shape = dataclasses.replace(decoder_shape(config), apply_layernorm_1p=True)
    state = decoder_state(original, config, shape, str(source))
    assert torch.allclose(state["layers.0.attention.q_layernorm.weight"] + 1,
                          original["model.layers.0.self_attn.q_norm.weight"])
    model = GPT(shape).eval()
    model.load_state_dict(state, strict=False)
    batch = tokens()
    with torch.no_grad():
        want = hf_llama(source)(batch).logits
        got = model(batch, torch.arange(SEQUENCE).expand_as(batch))
    assert torch.allclose(got, want, rtol=0, atol=max_logit_tolerance(want, RELATIVE_TOLERANCE))
    _, exported = export_decoder(state, shape, TINY_VOCAB, None, "qwen3")
    assert exported.keys() == original.keys()
    for name, tensor in original.items():
        assert torch.allclose(exported[name], tensor, rtol=0, atol=1e-6), name


def test_transformers_4_spelling_and_several_eos_ids_are_read(tmp_path):
    """Hub files written by transformers 4 keep rope_theta and rope_scaling at the top level; Llama 3's instruct
    models name several eos ids (the first is the end-of-document id)."""
    from trainer.checkpoint.hf_files import read_hf_config
    from trainer.models.gpt.hf_decoders import decoder_shape, hf_eos_id

    source = make_tiny_llama(tmp_path / "hf", "llama3")
    config = read_hf_config(source)
    old = {key: value for key, value in config.items() if key != "rope_parameters"}
    rope = dict(config["rope_parameters"])
    old |= {"rope_theta": rope.pop("rope_theta"), "rope_scaling": rope, "eos_token_id": [TINY_VOCAB - 1, 7]}
    (source / "config.json").write_text(json.dumps(old))
    assert decoder_shape(read_hf_config(source)) == decoder_shape(config)
    assert hf_eos_id(old) == TINY_VOCAB - 1
    assert main(["--from-hf", str(source), "--to", str(tmp_path / "ckpt")]) == 0
    assert checkpoint_model(tmp_path / "ckpt")[2].eod_id == TINY_VOCAB - 1
