"""Importing a Hugging Face T5/mT5 does not change the model (issue 15 §4).

- a tied mT5 (what transformers 5 writes for `MT5Config`: ``tie_word_embeddings`` true, no scaling of
  the decoder output) stays tied and unscaled through ``train --load-hf``, through ``convert-checkpoint
  --from-hf`` + ``train --load``, and exports back as an mT5 whose logits equal our model's;
- encoder/decoder embeddings that differ from ``shared.weight`` are refused in one line naming them.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from hf_testing import seed_weights
from trainer_testing import argv_for, t5_config

from trainer.checkpoint.store import resolve_checkpoint
from trainer.cli.train import main as train_main
from trainer.config import ParallelismConfig
from trainer.cli.convert import main as convert_main
from trainer.models.t5.config import resolve_t5_special_ids
from trainer.models.t5.convert import load_t5_checkpoint, read_t5_model_config, t5_train_defaults
from trainer.models.t5.hf import load_hf_t5

# Logits agree within this fraction of the largest one (fp32 on both sides, different kernels; see
# test_t5_hf.LOGIT_RTOL). A wrong scale is off by a factor of d_model**-0.5 = 0.18.
LOGIT_RTOL = 1e-5
VOCAB_MULTIPLE = 128


def _make_tied_mt5(directory: Path, vocab_size: int) -> Path:
    """A tiny random tied mT5, saved by transformers itself."""
    from transformers import MT5Config, MT5ForConditionalGeneration

    config = MT5Config(vocab_size=-(-vocab_size // VOCAB_MULTIPLE) * VOCAB_MULTIPLE, d_model=32, d_kv=8,
                       d_ff=48, num_heads=4, num_layers=2, num_decoder_layers=2, dropout_rate=0.0,
                       tie_word_embeddings=True)
    seed_weights(MT5ForConditionalGeneration(config), seed=0, std=0.5).save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def tied_mt5(sentence_prefix, data_test, tmp_path_factory) -> Path:
    """A tiny random tied mT5 over the test run's tokenizer (SentencePieceTokenizer + 100 sentinels)."""
    tokenizer_vocab = resolve_t5_special_ids(t5_config(sentence_prefix, data_test, "").data, 100).vocab_size
    return _make_tied_mt5(tmp_path_factory.mktemp("mt5") / "tied-mt5", tokenizer_vocab)


def _argv(prefix, data_test, tmp_path: Path, *extra: str) -> list[str]:
    """One step of the test T5 run with only data, batch and tokenizer flags (the shape comes from elsewhere)."""
    config = t5_config(prefix, data_test, str(tmp_path / "cache"), train_iters=1)
    config = dataclasses.replace(config, model=dataclasses.replace(type(config.model)(), hidden_dropout=0.0,
                                                                   make_vocab_size_divisible_by=64),
                                 parallelism=ParallelismConfig())
    return [*argv_for(config), *extra]


def _logits_match_ours(checkpoint: Path, hf_dir: Path) -> None:
    """The exported directory, loaded by transformers, gives our checkpoint's logits."""
    from transformers import AutoConfig, MT5ForConditionalGeneration

    assert AutoConfig.from_pretrained(hf_dir).model_type == "mt5"
    root, iteration = resolve_checkpoint(str(checkpoint))
    ours, _ = load_t5_checkpoint(root, iteration)
    theirs = MT5ForConditionalGeneration.from_pretrained(hf_dir).eval()
    generator = torch.Generator().manual_seed(0)
    encoder = torch.randint(2, 200, (2, 9), generator=generator)
    decoder = torch.randint(2, 200, (2, 5), generator=generator)
    with torch.no_grad():
        expected = theirs(input_ids=encoder, decoder_input_ids=decoder).logits
        got = ours.eval()(encoder, decoder)[..., :expected.shape[-1]]
    assert torch.allclose(got, expected, rtol=0, atol=LOGIT_RTOL * expected.abs().max().item())


def test_a_tied_mt5_is_tied_and_unscaled_as_transformers_runs_it(tied_mt5):
    shape = load_hf_t5(tied_mt5).shape
    assert shape.tie_word_embeddings and not shape.scale_decoder_outputs
    defaults = t5_train_defaults(tied_mt5)
    assert defaults["model"]["untie_embeddings_and_output_weights"] is False
    assert defaults["t5"]["scale_decoder_outputs"] is False


def test_convert_round_trip_gives_transformers_logits(tied_mt5, tmp_path):
    from transformers import MT5ForConditionalGeneration

    assert convert_main(["--from-hf", str(tied_mt5), "--to", str(tmp_path / "ckpt")]) == 0
    assert convert_main(["--from", str(tmp_path / "ckpt"), "--to-hf", str(tmp_path / "back")]) == 0
    original = MT5ForConditionalGeneration.from_pretrained(tied_mt5).eval()
    back = MT5ForConditionalGeneration.from_pretrained(tmp_path / "back").eval()
    ids = torch.randint(2, 200, (2, 7), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = original(input_ids=ids, decoder_input_ids=ids[:, :4]).logits
        got = back(input_ids=ids, decoder_input_ids=ids[:, :4]).logits
    assert torch.allclose(got, expected, rtol=0, atol=LOGIT_RTOL * expected.abs().max().item())
    _logits_match_ours(tmp_path / "ckpt", tied_mt5)


def test_train_load_hf_keeps_a_tied_mt5_and_exports_it_back(sentence_prefix, data_test, tied_mt5, tmp_path):
    run = tmp_path / "run"
    assert train_main(_argv(sentence_prefix, data_test, tmp_path, "--load-hf", str(tied_mt5),
                            "--save", str(run))) == 0
    info = read_t5_model_config(run)
    assert info["model_type"] == "mt5"
    assert info["shape"].tie_word_embeddings and not info["shape"].scale_decoder_outputs
    assert convert_main(["--from", str(run), "--to-hf", str(tmp_path / "exported")]) == 0
    _logits_match_ours(run, tmp_path / "exported")


def test_convert_then_train_load_keeps_a_tied_mt5(sentence_prefix, data_test, tied_mt5, tmp_path):
    assert convert_main(["--from-hf", str(tied_mt5), "--to", str(tmp_path / "converted"),
                         "--make-vocab-size-divisible-by", "64"]) == 0
    run = tmp_path / "run"
    assert train_main(_argv(sentence_prefix, data_test, tmp_path, "--load", str(tmp_path / "converted"),
                            "--save", str(run))) == 0
    info = read_t5_model_config(run)
    assert info["model_type"] == "mt5"
    assert info["shape"].tie_word_embeddings and not info["shape"].scale_decoder_outputs
    assert convert_main(["--from", str(run), "--to-hf", str(tmp_path / "exported")]) == 0
    _logits_match_ours(run, tmp_path / "exported")


@pytest.mark.parametrize("copies", [("encoder.embed_tokens.weight",),
                                    ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight")])
def test_embeddings_that_differ_from_shared_are_refused_naming_them(tied_mt5, tmp_path, capsys, copies):
    directory = tmp_path / "edited"
    directory.mkdir()
    tensors = load_file(tied_mt5 / "model.safetensors")
    for name in copies:
        tensors[name] = tensors["shared.weight"] + 1.0
    save_file(tensors, directory / "model.safetensors", metadata={"format": "pt"})
    (directory / "config.json").write_text((tied_mt5 / "config.json").read_text())
    assert convert_main(["--from-hf", str(directory), "--to", str(tmp_path / "ckpt")]) != 0
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    assert all(name in err for name in copies) and "shared.weight" in err


def test_embedding_copies_equal_to_shared_are_accepted(tied_mt5, tmp_path):
    directory = tmp_path / "copies"
    directory.mkdir()
    tensors = load_file(tied_mt5 / "model.safetensors")
    for name in ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight"):
        tensors[name] = tensors["shared.weight"].clone()
    save_file(tensors, directory / "model.safetensors", metadata={"format": "pt"})
    (directory / "config.json").write_text((tied_mt5 / "config.json").read_text())
    assert convert_main(["--from-hf", str(directory), "--to", str(tmp_path / "ckpt")]) == 0


WORDPIECE_IDS = 1102
"""BertWordPieceLowerCase over data_test's vocab.txt with Megatron's [BOS]/[EOS] and 100 sentinels."""


@pytest.mark.parametrize(("model_vocab", "fits"), [(WORDPIECE_IDS, True), (640, False)])
def test_the_users_tokenizer_flags_replace_the_directorys_tokenizer(sentence_prefix, data_test, tmp_path, capsys,
                                                                    model_vocab, fits):
    directory = _make_tied_mt5(tmp_path / "mt5", model_vocab)
    shutil.copy(data_test / "tokenizers" / "sp-unigram.model", directory / "spiece.model")
    argv = _argv(sentence_prefix, data_test, tmp_path, "--load-hf", str(directory))
    at = argv.index("--tokenizer-type")
    del argv[at:at + 4]  # the run's SentencePiece flags: the user names a WordPiece tokenizer instead
    argv += ["--tokenizer-type", "BertWordPieceLowerCase",
             "--vocab-file", str(data_test / "tokenizers" / "wordpiece-vocab.txt")]
    assert train_main(argv) == (0 if fits else 1)
    err = capsys.readouterr().err
    assert "is not used by" not in err
    if not fits:
        lines = [line for line in err.splitlines() if "error" in line]
        assert len(lines) == 1 and f"{WORDPIECE_IDS} ids" in lines[0] and "vocab-size" in lines[0]
