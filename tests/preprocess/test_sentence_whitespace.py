"""Whitespace between sentences (issue 10 §5): Megatron's Punkt splitter drops it, and so does our
default path (Megatron's bytes); `inspect-index --docs` shows such a document with one space between
its sentences; `--keep-newlines` keeps the whitespace attached to the sentence before, so the decoded
sentences of a document give back its text."""

from __future__ import annotations

import json

from indexed_dataset import IndexedDataset
from preprocess import cli
from indexed_dataset.inspect import join_sentences
from preprocess.sentences import SentenceSplitter
from preprocess.tokenizers import TokenizerConfig, build_tokenizer
from preprocess_testing import GPT2_FLAGS, GPT2_MERGES, GPT2_VOCAB, write_jsonl

TEXT = "First sentence here.  Second one!\nThird line?\n\nFourth after a blank line."


def test_keep_newlines_keeps_every_separator_and_the_default_drops_them_as_megatron():
    assert "".join(SentenceSplitter(keep_newlines=True).split(TEXT)) == TEXT
    assert SentenceSplitter().split(TEXT) == ["First sentence here.", "Second one!", "Third line?",
                                              "Fourth after a blank line."]


def test_decoded_sentences_with_keep_newlines_give_back_the_document(tmp_path):
    source = write_jsonl(str(tmp_path / "in.jsonl"), [{"text": TEXT}])
    assert cli.main(["--input", source, "--output-prefix", str(tmp_path / "out"), *GPT2_FLAGS,
                     "--split-sentences", "--keep-newlines"]) == 0
    dataset = IndexedDataset(str(tmp_path / "out_text_sentence"))
    tokenizer = build_tokenizer(TokenizerConfig(tokenizer_type="GPT2BPETokenizer", vocab_file=GPT2_VOCAB,
                                                merge_file=GPT2_MERGES))
    assert len(dataset) == 4
    assert "".join(tokenizer.decode(dataset[i]) for i in range(len(dataset))) == TEXT


def test_inspect_index_decodes_split_sentences_with_the_space_between_them(tmp_path, capsys):
    from trainer.cli import inspect as inspect_cli

    source = write_jsonl(str(tmp_path / "in.jsonl"), [{"text": TEXT}])
    assert cli.main(["--input", source, "--output-prefix", str(tmp_path / "out"), *GPT2_FLAGS,
                     "--split-sentences"]) == 0
    capsys.readouterr()
    assert inspect_cli.main([str(tmp_path / "out_text_sentence"), "--docs", "0", "--json", *GPT2_FLAGS]) == 0
    decoded = json.loads(capsys.readouterr().out)["decoded"]["0"]
    assert decoded == "First sentence here. Second one! Third line? Fourth after a blank line."


def test_joining_never_doubles_whitespace_that_is_there():
    assert join_sentences(["A.\n", "B.", " C.", "D."]) == "A.\nB. C. D."
    assert join_sentences(["only one"]) == "only one"
