"""`inspect-index --model bert` shows the BERT samples training reads: [CLS] A [SEP] B [SEP] after masking,
the masked positions and their labels, and the sentence-order label (`samplers.bert.view`)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from bert_golden import MASK_PROB, SEQUENCE_LENGTH, SPLIT, VOCAB_FILE, vocabulary, write_bert_corpus

from samplers.bert.dataset import BertDatasetConfig, build_bert_datasets
from samplers.bert.masking import masking_options
from samplers.bert.view import vocabulary_pieces
from samplers.view import ViewVocabulary
from trainer.cli import inspect as inspect_cli

TOKENIZER_FLAGS = ["--vocab-file", str(VOCAB_FILE), "--tokenizer-type", "BertWordPieceLowerCase"]
# What Megatron's BertWordPieceLowerCase holds: the file's pieces, then its appended [BOS] and [EOS].
TRAINING_PIECES = vocabulary() + ["[BOS]", "[EOS]"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> str:
    return write_bert_corpus(tmp_path_factory.mktemp("bert_view") / "corpus")


def view_argv(corpus: str, cache, *extra: str) -> list[str]:
    return [corpus, "--model", "bert", "--seq-length", str(SEQUENCE_LENGTH), "--split", SPLIT,
            "--data-cache-path", str(cache), *extra, *TOKENIZER_FLAGS]


def training_split(corpus: str, cache, binary_head: bool = True):
    """The train split a `train --model bert` run builds (trainer.models.bert.training's options)."""
    config = BertDatasetConfig(data_prefix=corpus, masking=masking_options(TRAINING_PIECES, MASK_PROB),
                               pad_id=TRAINING_PIECES.index("[PAD]"), split=SPLIT, sequence_length=SEQUENCE_LENGTH,
                               binary_head=binary_head, path_to_cache=str(cache))
    return build_bert_datasets(config)[0]


@pytest.mark.parametrize("binary_head", [True, False])
def test_json_view_holds_the_samples_training_reads(corpus, tmp_path, capsys, binary_head):
    extra = ["--samples", "0,3,-1", "--json"] + ([] if binary_head else ["--bert-no-binary-head"])
    assert inspect_cli.main(view_argv(corpus, tmp_path, *extra)) == 0
    train_view, valid_view, test_view = json.loads(capsys.readouterr().out)["training"]["splits"]
    train = training_split(corpus, tmp_path, binary_head)
    assert test_view is None and valid_view["num_samples"] > 0
    assert train_view["num_samples"] == len(train) and train_view["document_range"] == list(train.document_range)
    for sample_id, index in (("0", 0), ("3", 3), ("-1", len(train) - 1)):
        item, sample = train[index], train_view["samples"][sample_id]
        length = len(sample["tokens"])
        assert sample["tokens"] == item["text"][:length].tolist() and not item["padding_mask"][length:].any()
        assert sample["types"] == item["types"][:length].tolist()
        assert sample["masked_positions"] == np.flatnonzero(item["loss_mask"]).tolist()
        assert sample["labels"] == item["labels"][sample["masked_positions"]].tolist()
        assert (sample["is_random"], sample["truncated"]) == (item["is_random"], item["truncated"])
        pieces = sample["text"].split(" ")
        assert pieces[0] == "[CLS]" and pieces[-1] == "[SEP]"
        assert pieces.count("[SEP]") == (2 if binary_head else 1)
    if not binary_head:
        assert all(sample["is_random"] == 0 for sample in train_view["samples"].values())


def test_text_view_shows_input_masks_and_sentence_order(corpus, tmp_path, capsys):
    assert inspect_cli.main(view_argv(corpus, tmp_path, "--samples", "0")) == 0
    out = capsys.readouterr().out
    assert f"training view   bert, seq-length {SEQUENCE_LENGTH}, mask-prob {MASK_PROB}, sentence order" in out
    assert "--- train sample 0 (is_random " in out and "input:  [CLS] " in out and "masked: " in out
    assert "test            absent" in out


def test_the_bert_view_needs_the_tokenizer(corpus, tmp_path, capsys):
    assert inspect_cli.main([corpus, "--model", "bert", "--seq-length", "32", "--data-cache-path", str(tmp_path)]) == 1
    error = capsys.readouterr().err.strip()
    assert error.startswith("inspect-index: error: --model bert needs the tokenizer (its WordPiece pieces")
    assert len(error.splitlines()) == 1


def test_a_blend_is_refused_in_one_line(corpus, tmp_path, capsys):
    assert inspect_cli.main(["--data-path", corpus, "--model", "bert", "--seq-length", "32", *TOKENIZER_FLAGS]) != 0
    error = capsys.readouterr().err.strip().splitlines()
    assert error == ["inspect-index: error: --model bert trains on one dataset: give its path, not --data-path"]


def test_vocabulary_pieces_place_every_named_token_at_its_id():
    vocabulary = ViewVocabulary(size=5, names={"[CLS]": 0, "##a": 2, "[MASK]": 4, "beyond": 9}, roles={})
    assert vocabulary_pieces(vocabulary) == ["[CLS]", "", "##a", "", "[MASK]"]


def test_the_view_vocabulary_of_a_wordpiece_tokenizer_is_the_one_training_masks_with():
    from preprocess.tokenizers import TokenizerConfig, build_tokenizer

    tokenizer = build_tokenizer(TokenizerConfig(tokenizer_type="BertWordPieceLowerCase", vocab_file=str(VOCAB_FILE)))
    vocabulary = inspect_cli.view_vocabulary(tokenizer, "BertWordPieceLowerCase", 0)
    assert vocabulary_pieces(vocabulary) == TRAINING_PIECES
    assert vocabulary.role("pad") == TRAINING_PIECES.index("[PAD]")
    assert vocabulary.numbered("<extra_id_{}>") == ()
    with pytest.raises(ValueError, match="no bos token"):
        vocabulary.role("bos")
