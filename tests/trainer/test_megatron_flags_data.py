"""Megatron's GPT data flags (issue 29, section 3) change what is trained, exactly as Megatron does:

- ``--reset-position-ids``, ``--reset-attention-mask``, ``--eod-mask-loss``: our GPT micro-batches (tokens, targets =
  labels where the loss mask is 1, position ids, attention mask) equal megatron-core 0.16.1's GPTDataset items
  for the same flags over the bundled GPT-2 token file (golden arrays written by
  tests/trainer/make_megatron_gpt_items_golden.py into data_test/trainer/megatron_gpt_items.npz);
- a run with them trains, and the document mask changes the losses (tokens no longer see other documents);
- without a tokenizer's EOD id, with pipelining (the mask), with T5/BERT, or ``--reset-attention-mask`` with
  ``--no-create-attention-mask-in-dataloader``: one line naming the flag, nothing written;
- ``--no-create-attention-mask-in-dataloader`` alone is accepted: our batches never carry the causal mask.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from make_megatron_gpt_items_golden import CASES, EOD_ID, NUM_ITEMS, SEED, SEQ_LENGTH, SPLIT

from trainer.cli.train import main
from trainer.config import DataConfig
from trainer.data.batches import IGNORE_INDEX, Vocabulary
from trainer.models.gpt.data import build_datasets, collate
from trainer_testing import argv_for, tiny_config
from trainer.train import train

GPT2_VOCABULARY = Vocabulary(size=EOD_ID + 1, eod_id=EOD_ID, pad_id=None)


@pytest.fixture(scope="module")
def megatron_items(data_test):
    with np.load(data_test / "trainer" / "megatron_gpt_items.npz") as arrays:
        return dict(arrays)


@pytest.mark.parametrize("case", list(CASES))
def test_our_gpt_batches_equal_megatron_cores_items(case, megatron_items, data_test, tmp_path):
    flags = {flag: True for flag in CASES[case]}
    data = DataConfig(dataset=[str(data_test / "megatron" / "sample_en_eod_text_document")], split=SPLIT,
                      seed=SEED, data_cache_path=str(tmp_path), **flags)
    train_split, _, _ = build_datasets(data, SEQ_LENGTH, GPT2_VOCABULARY, (NUM_ITEMS, None, None))
    batch = collate([train_split[i] for i in range(NUM_ITEMS)], GPT2_VOCABULARY.size)
    expected = {key.split(".", 1)[1]: value for key, value in megatron_items.items() if key.startswith(f"{case}.")}
    assert np.array_equal(batch.tokens.numpy(), expected["tokens"])
    labels = np.where(expected["loss_mask"] == 1, expected["labels"], IGNORE_INDEX)
    assert np.array_equal(batch.targets.numpy(), labels)
    assert np.array_equal(batch.position_ids.numpy(), expected["position_ids"])
    if "reset_attention_mask" in flags:
        assert np.array_equal(batch.attention_mask.numpy(), expected["attention_mask"])
    else:  # Megatron's mask is then the causal one, which our attention kernel applies itself
        assert batch.attention_mask is None
        causal = ~np.tril(np.ones((SEQ_LENGTH, SEQ_LENGTH), dtype=bool))
        assert (expected["attention_mask"] == causal).all()
    # The golden data does cross documents, so the flags are tested where they matter.
    assert (expected["tokens"] == EOD_ID).any()


def gpt2_run(data_test, cache_dir, tmp_path, **data_flags):
    config = tiny_config(str(data_test / "megatron" / "sample_en_eod_text_document"), cache_dir, train_iters=2,
                         num_layers=2, hidden_size=16)
    config.model.vocab_size = None
    config.model.seq_length = config.model.max_position_embeddings = 256
    config.data = dataclasses.replace(config.data, vocab_file=str(data_test / "gpt2" / "gpt2-vocab.json"),
                                      merge_file=str(data_test / "gpt2" / "gpt2-merges.txt"), **data_flags)
    return config


@pytest.mark.timeout(300)
def test_a_run_with_the_document_flags_trains_and_the_mask_changes_the_losses(data_test, cache_dir, tmp_path):
    plain = train(gpt2_run(data_test, cache_dir, tmp_path)).losses
    masked = train(gpt2_run(data_test, cache_dir, tmp_path, reset_attention_mask=True)).losses
    everything = train(gpt2_run(data_test, cache_dir, tmp_path, reset_attention_mask=True, reset_position_ids=True,
                                eod_mask_loss=True)).losses
    assert all(np.isfinite(plain + masked + everything))
    assert masked != plain and everything != masked


def test_the_document_mask_is_causal_within_a_document():
    """A forward with the mask of one whole document equals the causal kernel's."""
    from trainer.models.gpt.model import GPT, GPTShape

    torch.manual_seed(0)
    model = GPT(GPTShape(num_layers=1, hidden_size=16, num_attention_heads=4, ffn_hidden_size=32,
                         max_position_embeddings=8, padded_vocab_size=64, hidden_dropout=0.0, attention_dropout=0.0,
                         init_method_std=0.02, layernorm_epsilon=1e-5))
    tokens = torch.randint(0, 64, (2, 8))
    positions = torch.arange(8).expand(2, 8)
    causal_mask = ~torch.ones(8, 8, dtype=torch.bool).tril().expand(2, 1, 8, 8)
    assert torch.allclose(model(tokens, positions), model(tokens, positions, attention_mask=causal_mask), atol=1e-6)


def refused(argv, capsys, tmp_path):
    before = sorted(tmp_path.rglob("*"))
    code = main(argv)
    lines = capsys.readouterr().err.splitlines()
    assert code != 0 and len(lines) == 1, lines
    assert "Traceback" not in lines[0]
    assert sorted(tmp_path.rglob("*")) == before
    return lines[0]


def test_the_document_flags_need_an_eod_id(tiny_prefix, cache_dir, tmp_path, capsys):
    argv = argv_for(tiny_config(tiny_prefix, cache_dir, train_iters=1, num_layers=1, hidden_size=16))
    line = refused([*argv, "--eod-mask-loss", "--save", str(tmp_path / "run")], capsys, tmp_path)
    assert "--eod-mask-loss" in line and "end-of-document" in line


def test_the_document_mask_is_refused_under_pipelining(tiny_prefix, cache_dir, tmp_path, capsys):
    argv = argv_for(tiny_config(tiny_prefix, cache_dir, train_iters=1, num_layers=2, hidden_size=16, pp=2))
    line = refused([*argv, "--reset-attention-mask", "--nproc-per-node", "2"], capsys, tmp_path)
    assert "--reset-attention-mask" in line and "--pipeline-model-parallel-size" in line


def test_reset_attention_mask_without_the_dataloader_mask_is_a_contradiction(tiny_prefix, cache_dir, tmp_path,
                                                                              capsys):
    argv = argv_for(tiny_config(tiny_prefix, cache_dir, train_iters=1, num_layers=1, hidden_size=16))
    line = refused([*argv, "--reset-attention-mask", "--no-create-attention-mask-in-dataloader"], capsys, tmp_path)
    assert "--reset-attention-mask" in line and "--no-create-attention-mask-in-dataloader" in line


@pytest.mark.parametrize("model", ["t5", "bert"])
def test_the_document_flags_are_gpts(model, capsys, tmp_path):
    line = refused(["--model", model, "--num-layers", "1", "--hidden-size", "16", "--num-attention-heads", "4",
                    "--vocab-size", "64", "--dataset", "x", "--reset-position-ids"], capsys, tmp_path)
    assert "--reset-position-ids" in line and model in line


@pytest.mark.timeout(300)
def test_no_create_attention_mask_in_dataloader_changes_nothing(tiny_prefix, cache_dir):
    config = tiny_config(tiny_prefix, cache_dir, train_iters=2, num_layers=1, hidden_size=16)
    plain = train(config).losses
    config.data.no_create_attention_mask_in_dataloader = True
    assert train(config).losses == plain
