"""T5/mT5 interop with Hugging Face: same logits after import, same greedy tokens, lossless export.

The oracle models are tiny random T5ForConditionalGeneration / MT5ForConditionalGeneration made
locally with transformers (nothing downloaded), their weights drawn from our own seeded generator
(`hf_testing.seed_weights`) with a large standard deviation, so logits are far apart and greedy decoding
produces varied tokens.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from hf_testing import seed_weights

from trainer.checkpoint.hf_files import read_hf_config, write_json
from trainer.errors import HFConversionError
from trainer.models.t5.hf import load_hf_t5, save_hf_t5
from trainer.models.t5.generate import greedy_generate
from trainer.models.t5.model import T5, T5Shape

VOCAB = 200
TINY = dict(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=48, num_heads=4, num_layers=2, num_decoder_layers=3,
            relative_attention_num_buckets=8, relative_attention_max_distance=20, dropout_rate=0.0)
# Standard deviation of the fixtures' matrices and embeddings: logits of about +-10, far apart.
WEIGHT_STD = 0.5
# Logits agree within this fraction of the largest logit. Both sides compute in fp32 (eps 1.2e-7) but not
# with the same kernels (torch's fused tanh-GELU against transformers' Python formula, other matmul
# splits); the ulp-sized differences grow through the layers with the weights' scale, to at most 4e-6 of
# the largest logit on these fixtures (measured). A wrong tensor or scale is off by whole units.
LOGIT_RTOL = 1e-5
PAD, EOS = 0, 1


def make_hf(directory: Path, variant: str, seed: int = 0) -> Path:
    """A tiny random HF model: "t5" (v1.0: ReLU, tied, scaled) or "mt5" (gated GELU, untied head)."""
    from transformers import MT5Config, MT5ForConditionalGeneration, T5Config, T5ForConditionalGeneration

    if variant == "t5":
        model = T5ForConditionalGeneration(T5Config(feed_forward_proj="relu", **TINY))
        seed_weights(model, seed, WEIGHT_STD).save_pretrained(directory)
        return directory
    model = seed_weights(MT5ForConditionalGeneration(MT5Config(feed_forward_proj="gated-gelu", **TINY)), seed,
                         WEIGHT_STD)
    # transformers 5 always ties mT5's head on creation; real mT5 checkpoints hold their own lm_head.
    state = {name: tensor.clone() for name, tensor in model.state_dict().items()
             if not name.endswith("embed_tokens.weight")}
    head_generator = torch.Generator().manual_seed(seed + 1)
    state["lm_head.weight"] = torch.randn(VOCAB, TINY["d_model"], generator=head_generator) * WEIGHT_STD
    directory.mkdir(parents=True)
    save_file(state, directory / "model.safetensors", metadata={"format": "pt"})
    write_json(directory / "config.json", model.config.to_dict())
    return directory


def hf_model(directory: Path, variant: str):
    from transformers import MT5ForConditionalGeneration, T5ForConditionalGeneration

    cls = T5ForConditionalGeneration if variant == "t5" else MT5ForConditionalGeneration
    return cls.from_pretrained(directory).eval()


def batch(seed: int = 1):
    generator = torch.Generator().manual_seed(seed)
    encoder = torch.randint(2, VOCAB, (3, 11), generator=generator)
    mask = torch.ones_like(encoder)
    mask[1, 7:] = 0  # a padded encoder input
    encoder[1, 7:] = PAD
    decoder = torch.randint(2, VOCAB, (3, 6), generator=generator)
    decoder[:, 0] = PAD
    return encoder, mask, decoder


@pytest.mark.parametrize("variant", ["t5", "mt5"])
def test_imported_model_gives_hf_logits(tmp_path, variant):
    directory = make_hf(tmp_path / variant, variant)
    model, reference = load_hf_t5(directory).eval(), hf_model(directory, variant)
    assert model.shape.tie_word_embeddings == (variant == "t5")
    assert model.shape.feed_forward == ("relu" if variant == "t5" else "gated-gelu")
    encoder, mask, decoder = batch()
    with torch.no_grad():
        ours = model(encoder, decoder, mask)
        theirs = reference(input_ids=encoder, attention_mask=mask, decoder_input_ids=decoder).logits
    assert ours.shape == theirs.shape
    torch.testing.assert_close(ours, theirs, atol=LOGIT_RTOL * theirs.abs().max().item(), rtol=0)


@pytest.mark.parametrize("variant", ["t5", "mt5"])
@pytest.mark.parametrize("use_cache", [True, False])
def test_greedy_generation_matches_hf_token_for_token(tmp_path, variant, use_cache):
    directory = make_hf(tmp_path / variant, variant, seed=3)
    model, reference = load_hf_t5(directory).eval(), hf_model(directory, variant)
    encoder, mask, _ = batch(seed=4)
    ours = greedy_generate(model, encoder, max_new_tokens=12, decoder_start_id=PAD, eos_id=EOS, pad_id=PAD,
                           encoder_attention_mask=mask, use_cache=use_cache)
    with torch.no_grad():
        # transformers' decoder cache assumes as many decoder as encoder layers: the oracle runs without it.
        theirs = reference.generate(input_ids=encoder, attention_mask=mask, do_sample=False, max_new_tokens=12,
                                    decoder_start_token_id=PAD, use_cache=False)
    assert ours.tolist() == theirs.tolist()
    assert len(set(ours[:, 1:].flatten().tolist())) > 3, "the greedy output should be varied"


@pytest.mark.parametrize("variant", ["t5", "mt5"])
def test_export_round_trips_and_hf_loads_it(tmp_path, variant):
    shape = T5Shape(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=48, num_heads=4, num_encoder_layers=2,
                    num_decoder_layers=2, feed_forward="relu" if variant == "t5" else "gated-gelu",
                    tie_word_embeddings=variant == "t5", scale_decoder_outputs=variant == "t5",
                    relative_attention_num_buckets=8, relative_attention_max_distance=20, initializer_factor=0.5)
    torch.manual_seed(0)
    model = T5(shape).eval()
    save_hf_t5(model, tmp_path / "out", model_type=variant)
    again = load_hf_t5(tmp_path / "out").eval()
    assert again.shape == shape
    for (name, ours), (_, theirs) in zip(model.state_dict().items(), again.state_dict().items()):
        assert torch.equal(ours, theirs), name
    encoder, mask, decoder = batch()
    with torch.no_grad():
        theirs = hf_model(tmp_path / "out", variant)(input_ids=encoder, attention_mask=mask,
                                                     decoder_input_ids=decoder).logits
        torch.testing.assert_close(model(encoder, decoder, mask), theirs,
                                   atol=LOGIT_RTOL * theirs.abs().max().item(), rtol=0)


def test_import_names_the_missing_tensor(tmp_path):
    directory = make_hf(tmp_path / "t5", "t5")
    from safetensors.torch import load_file

    tensors = load_file(directory / "model.safetensors")
    del tensors["decoder.block.1.layer.1.EncDecAttention.k.weight"]
    save_file(tensors, directory / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(HFConversionError, match="decoder.block.1.layer.1.EncDecAttention.k.weight"):
        load_hf_t5(directory)


def test_import_rejects_other_models(tmp_path):
    directory = make_hf(tmp_path / "t5", "t5")
    config = read_hf_config(directory) | {"model_type": "bart"}
    write_json(directory / "config.json", config)
    with pytest.raises(HFConversionError, match="model_type 'bart'"):
        load_hf_t5(directory)


def test_pytorch_model_bin_loads_like_safetensors(tmp_path):
    from safetensors.torch import load_file

    directory = make_hf(tmp_path / "t5", "t5")
    reference = load_hf_t5(directory).eval()
    weights = directory / "model.safetensors"
    torch.save(load_file(weights), directory / "pytorch_model.bin")
    weights.unlink()
    model = load_hf_t5(directory).eval()
    encoder, mask, decoder = batch()
    with torch.no_grad():
        assert torch.equal(model(encoder, decoder, mask), reference(encoder, decoder, mask))


@pytest.mark.parametrize("variant", ["t5", "mt5"])
def test_generate_command_on_a_t5_directory_matches_hf_greedy(tmp_path, variant, capsys):
    import json

    from trainer.cli.generate import main

    directory = make_hf(tmp_path / variant, variant)
    encoder, mask, _ = batch()
    prompts = [row[m.bool()].tolist() for row, m in zip(encoder, mask)]
    argv = ["--load", str(directory), "--greedy", "--json", "--max-new-tokens", "8", "--device", "cpu"]
    for prompt in prompts:
        argv += ["--prompt-ids", " ".join(map(str, prompt))]
    assert main(argv) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]

    reference = hf_model(directory, variant)
    for record, prompt in zip(records, prompts, strict=True):
        with torch.no_grad():
            # One prompt per call: no padding, and generation stops right after EOS.
            expected = reference.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=8,
                                          decoder_start_token_id=PAD, use_cache=False)[0, 1:].tolist()
        assert record["prompt"] == prompt and record["ids"] == expected


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_generate_command_runs_a_t5_directory_on_several_processes(tmp_path, capsys):
    """Two tensor-parallel processes give transformers' greedy tokens; a layout the model does not divide
    into is refused with one line before any process starts."""
    import json

    from process_testing import free_port

    from trainer.cli.generate import main

    directory = make_hf(tmp_path / "t5", "t5")
    prompt = [5, 6, 7, 8]
    common = ["--load", str(directory), "--prompt-ids", " ".join(map(str, prompt)), "--greedy", "--json",
              "--max-new-tokens", "6", "--device", "cpu", "--nproc-per-node", "2", "--master-port", str(free_port())]
    assert main([*common, "--tensor-model-parallel-size", "2"]) == 0
    [record] = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    with torch.no_grad():
        expected = hf_model(directory, "t5").generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=6,
                                                      decoder_start_token_id=PAD, use_cache=False)[0, 1:].tolist()
    assert record["ids"] == expected

    capsys.readouterr()  # transformers' loading progress
    # TINY has 2 encoder + 3 decoder layers: two pipeline stages cannot split them.
    assert main([*common, "--pipeline-model-parallel-size", "2"]) == 1
    err = capsys.readouterr().err
    assert err == ("generate: error: encoder + decoder layers 2 + 3 (5) is not divisible by "
                   "--pipeline-model-parallel-size (2)\n")


@pytest.mark.parametrize("variant", ["t5", "mt5"])
def test_convert_checkpoint_round_trips_t5_directories(tmp_path, variant):
    from trainer.cli.convert import main
    from trainer.models.t5.convert import read_t5_model_config

    directory = make_hf(tmp_path / variant, variant)
    assert main(["--from-hf", str(directory), "--to", str(tmp_path / "ckpt")]) == 0
    info = read_t5_model_config(tmp_path / "ckpt")
    # The vocabulary is padded as train pads it (multiple of 128); the real size is kept.
    assert (info["shape"].vocab_size, info["vocab_size"], info["model_type"]) == (256, VOCAB, variant)
    assert main(["--from", str(tmp_path / "ckpt"), "--to-hf", str(tmp_path / "back")]) == 0

    assert read_hf_config(tmp_path / "back")["model_type"] == variant
    encoder, mask, decoder = batch()
    with torch.no_grad():
        want = hf_model(directory, variant)(input_ids=encoder, attention_mask=mask, decoder_input_ids=decoder).logits
        got = hf_model(tmp_path / "back", variant)(input_ids=encoder, attention_mask=mask,
                                                    decoder_input_ids=decoder).logits
    assert torch.equal(got, want)
