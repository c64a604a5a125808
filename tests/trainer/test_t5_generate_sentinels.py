"""``generate`` with a T5/mT5 whose tokenizer is a plain spiece.model (issue 15 §1): generated sentinels
decode to ``<extra_id_k>`` instead of crashing in sentencepiece ("piece id is out of range"), and a
sentinel typed in a text prompt is encoded as the sentinel's id."""

from __future__ import annotations

import json
import shutil

import pytest
import sentencepiece
import torch
from hf_testing import DATA_TEST, seed_weights

from preprocess.tokenizers import TokenizerConfig, build_tokenizer
from trainer.cli.generate import main as generate_main
from trainer.models.t5.config import t5_text_tokenizer_for

SPIECE_VOCAB, MODEL_VOCAB = 300, 400
PROMPT = "小明去年阅读<extra_id_0>的风景。"


@pytest.fixture(scope="module")
def mt5_with_spiece(tmp_path_factory):
    """A tiny random mT5 whose head favours the sentinel rows, beside a T5-style spiece.model (pad 0, EOS 1)."""
    from transformers import MT5Config, MT5ForConditionalGeneration

    folder = tmp_path_factory.mktemp("mt5-spiece")
    texts = [json.loads(line)["text"] for line in (DATA_TEST / "sample_en.jsonl").read_text(encoding="utf-8").splitlines()]
    (folder / "corpus.txt").write_text("\n".join([*texts, "小明去年阅读了很多书,看到了美丽的风景。"]), encoding="utf-8")
    sentencepiece.SentencePieceTrainer.train(
        input=str(folder / "corpus.txt"), model_prefix=str(folder / "spiece"), vocab_size=SPIECE_VOCAB,
        model_type="unigram", character_coverage=1.0, num_threads=1, minloglevel=2, pad_id=0, eos_id=1, unk_id=2,
        bos_id=-1)
    model = seed_weights(MT5ForConditionalGeneration(MT5Config(
        vocab_size=MODEL_VOCAB, d_model=32, d_kv=8, d_ff=48, num_heads=4, num_layers=2, num_decoder_layers=2,
        dropout_rate=0.0)), seed=0, std=0.5)
    with torch.no_grad():
        model.shared.weight[SPIECE_VOCAB:] *= 3  # ids past the SentencePiece pieces win: sentinels
    directory = folder / "mt5"
    model.save_pretrained(directory)
    shutil.copy(folder / "spiece.model", directory / "spiece.model")
    return directory


def test_generated_sentinels_decode_to_their_names(mt5_with_spiece, capsys):
    assert generate_main(["--load", str(mt5_with_spiece), "--prompt", PROMPT, "--greedy", "--json",
                          "--max-new-tokens", "6"]) == 0
    completion = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert any(i >= SPIECE_VOCAB for i in completion["ids"])
    assert "<extra_id_" in completion["text"]


def test_a_typed_sentinel_is_the_sentinel_id(mt5_with_spiece):
    config = TokenizerConfig(tokenizer_type="GPTSentencePieceTokenizer",
                             tokenizer_model=str(mt5_with_spiece / "spiece.model"))
    tokenizer = t5_text_tokenizer_for(build_tokenizer(config), config, MODEL_VOCAB, mt5_with_spiece)
    ids = tokenizer.encode(PROMPT)
    assert SPIECE_VOCAB + 99 in ids and 2 not in ids  # <extra_id_0> (Hugging Face's numbering), no <unk>
