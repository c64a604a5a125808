"""HF GPT-2 directories <-> tokenmill checkpoints: same logits as transformers, exact round trips,
padded vocabularies, and one clear error naming the file or tensor for anything that does not fit."""

import json

import pytest
import safetensors.torch
import torch
from hf_testing import LOGIT_TOLERANCE, TINY_VOCAB, hf_model, make_tiny_hf, prompt_batch

from trainer.cli.convert import main
from trainer.models.gpt.convert import (
    checkpoint_model,
    export_hf_checkpoint,
    import_hf_checkpoint,
    read_checkpoint_state,
)
from trainer.checkpoint.hf_files import read_hf_weights
from trainer.errors import HFConversionError
from trainer.models.gpt.model import GPT


@pytest.fixture(scope="module")
def tiny_hf(tmp_path_factory):
    return make_tiny_hf(tmp_path_factory.mktemp("hf") / "tiny")


def our_model(path) -> tuple[GPT, int]:
    root, iteration, info = checkpoint_model(path)
    model = GPT(info.shape)
    model.load_state_dict(read_checkpoint_state(root, iteration, info.shape), strict=False)
    return model.eval(), info.vocab_size


def our_logits(model: GPT, vocab_size: int, tokens: torch.Tensor) -> torch.Tensor:
    positions = torch.arange(tokens.shape[1]).expand_as(tokens)
    with torch.no_grad():
        return model(tokens, positions)[..., :vocab_size]


def test_imported_model_gives_transformers_logits(tiny_hf, tmp_path):
    import_hf_checkpoint(tiny_hf, tmp_path / "ckpt")
    model, vocab = our_model(tmp_path / "ckpt")
    tokens = torch.tensor([p[:3] for p in prompt_batch((3, 5, 7, 9))])
    tokens = torch.cat([tokens, torch.tensor(prompt_batch((12,) * 4, seed=5))], dim=1)
    with torch.no_grad():
        want = hf_model(tiny_hf)(tokens).logits
    assert torch.allclose(our_logits(model, vocab, tokens), want, rtol=0, atol=LOGIT_TOLERANCE)


def test_vocabulary_is_padded_on_import_and_stripped_on_export(tiny_hf, tmp_path):
    import_hf_checkpoint(tiny_hf, tmp_path / "ckpt", make_vocab_size_divisible_by=64, tensor_model_parallel_size=2)
    root, iteration, info = checkpoint_model(tmp_path / "ckpt")
    assert (info.vocab_size, info.shape.padded_vocab_size) == (TINY_VOCAB, 384)
    state = read_checkpoint_state(root, iteration, info.shape)
    assert torch.count_nonzero(state["tok_embeddings.weight"][TINY_VOCAB:]) == 0
    export_hf_checkpoint(tmp_path / "ckpt", tmp_path / "out")
    exported = safetensors.torch.load_file(tmp_path / "out" / "model.safetensors")
    assert exported["transformer.wte.weight"].shape == (TINY_VOCAB, 64)


def test_round_trip_is_exact_and_loads_in_transformers(tiny_hf, tmp_path):
    assert main(["--from-hf", str(tiny_hf), "--to", str(tmp_path / "ckpt")]) == 0
    assert main(["--from", str(tmp_path / "ckpt"), "--to-hf", str(tmp_path / "out")]) == 0
    original, exported = read_hf_weights(tiny_hf), read_hf_weights(tmp_path / "out")
    assert exported.keys() == original.keys()
    for name, tensor in original.items():
        assert torch.equal(exported[name], tensor), name
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["model_type"] == "gpt2" and config["vocab_size"] == TINY_VOCAB
    tokens = torch.tensor(prompt_batch((6,) * 3))
    with torch.no_grad():
        assert torch.equal(hf_model(tmp_path / "out")(tokens).logits, hf_model(tiny_hf)(tokens).logits)


def test_hub_style_pytorch_bin_and_tokenizer_files_are_carried(tmp_path):
    source = make_tiny_hf(tmp_path / "bin", vocab_size=50257, with_gpt2_tokenizer=True)
    # The layout of the Hub's original gpt2 pytorch_model.bin: no "transformer." prefix, the causal-mask
    # buffers of every block, the tied head saved too.
    weights = {name.removeprefix("transformer."): t for name, t in read_hf_weights(source).items()}
    weights |= {f"h.{i}.attn.bias": torch.ones(1, 1, 128, 128).tril() for i in range(2)}
    weights["lm_head.weight"] = weights["wte.weight"]
    torch.save(weights, source / "pytorch_model.bin")
    (source / "model.safetensors").unlink()
    import_hf_checkpoint(source, tmp_path / "ckpt")
    export_hf_checkpoint(tmp_path / "ckpt" / "iter_0000000", tmp_path / "out")
    for name in ("vocab.json", "merges.txt"):
        assert (tmp_path / "out" / name).read_bytes() == (source / name).read_bytes()
    exported = read_hf_weights(tmp_path / "out")
    assert len(exported) == 4 + 12 * 2
    for name, tensor in exported.items():
        assert torch.equal(tensor, weights[name.removeprefix("transformer.")]), name


def _broken_copy(tiny_hf, tmp_path, edit_config=None, edit_weights=None):
    target = tmp_path / "broken"
    target.mkdir()
    config = json.loads((tiny_hf / "config.json").read_text())
    if edit_config:
        edit_config(config)
    (target / "config.json").write_text(json.dumps(config))
    weights = safetensors.torch.load_file(tiny_hf / "model.safetensors")
    if edit_weights:
        edit_weights(weights)
    safetensors.torch.save_file(weights, target / "model.safetensors", metadata={"format": "pt"})
    return target


@pytest.mark.parametrize("edit_config, edit_weights, message", [
    (lambda c: c.update(model_type="gpt_neox"), None, "model_type is 'gpt_neox'"),
    (lambda c: c.update(activation_function="relu"), None, "activation_function 'relu'"),
    (None, lambda w: w.pop("transformer.h.1.mlp.c_fc.bias"), "missing tensor transformer.h.1.mlp.c_fc.bias"),
    (None, lambda w: w.update({"transformer.h.0.attn.c_proj.weight": torch.zeros(64, 32)}),
     "tensor transformer.h.0.attn.c_proj.weight has shape (64, 32), the config needs (64, 64)"),
    (lambda c: c.update(n_layer=3), None, "missing tensor transformer.h.2.ln_1.weight"),
    (None, lambda w: w.update({"transformer.h.0.extra.weight": torch.zeros(2)}),
     "unexpected tensor h.0.extra.weight"),
])
def test_mismatched_directories_fail_with_one_clear_line(tiny_hf, tmp_path, capsys, edit_config, edit_weights,
                                                         message):
    broken = _broken_copy(tiny_hf, tmp_path, edit_config, edit_weights)
    with pytest.raises(HFConversionError, match=message.replace("(", r"\(").replace(")", r"\)")):
        import_hf_checkpoint(broken, tmp_path / "ckpt")
    assert main(["--from-hf", str(broken), "--to", str(tmp_path / "ckpt2")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("convert-checkpoint: error: ") and message in err
    assert not (tmp_path / "ckpt2" / "latest_checkpointed_iteration.txt").exists()


def test_missing_weights_and_bad_flags_are_reported(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_layer": 1, "n_embd": 8,
                                                                "n_head": 2, "n_positions": 8, "vocab_size": 10}))
    assert main(["--from-hf", str(tmp_path / "empty"), "--to", str(tmp_path / "c")]) == 1
    assert "no model weights (model.safetensors" in capsys.readouterr().err
    assert main(["--from", str(tmp_path / "c"), "--to", str(tmp_path / "x")]) == 2
    assert "give --from-hf with a checkpoint root (--to), or --from with --to-hf" in capsys.readouterr().err
    assert main(["--from", str(tmp_path / "nothing"), "--to-hf", str(tmp_path / "x")]) == 1
    assert "no checkpoint" in capsys.readouterr().err


def test_import_refuses_to_overwrite_a_checkpoint(tiny_hf, tmp_path):
    import_hf_checkpoint(tiny_hf, tmp_path / "ckpt")
    with pytest.raises(Exception, match="already holds a checkpoint"):
        import_hf_checkpoint(tiny_hf, tmp_path / "ckpt")


def test_sharded_weights_load_and_a_damaged_file_is_named(tiny_hf, tmp_path):
    sharded = tmp_path / "sharded"
    sharded.mkdir()
    (sharded / "config.json").write_bytes((tiny_hf / "config.json").read_bytes())
    weights = read_hf_weights(tiny_hf)
    names = sorted(weights)
    weight_map = {}
    for index, part in enumerate((names[: len(names) // 2], names[len(names) // 2:])):
        shard = f"model-0000{index + 1}-of-00002.safetensors"
        safetensors.torch.save_file({n: weights[n] for n in part}, sharded / shard, metadata={"format": "pt"})
        weight_map |= dict.fromkeys(part, shard)
    (sharded / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    loaded = read_hf_weights(sharded)
    assert loaded.keys() == weights.keys() and all(torch.equal(loaded[n], weights[n]) for n in names)
    damaged = sharded / "model-00002-of-00002.safetensors"
    damaged.write_bytes(damaged.read_bytes()[:100])
    with pytest.raises(HFConversionError, match="model-00002-of-00002.safetensors: cannot read weights"):
        import_hf_checkpoint(sharded, tmp_path / "ckpt")
