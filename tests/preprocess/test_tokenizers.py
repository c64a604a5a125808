"""Every tokenizer type builds offline and gives the reference library's ids on hard text."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest
import sentencepiece

from preprocess.errors import TokenizerError
from preprocess.tokenizers import TokenizerConfig, build_tokenizer
from preprocess.tokenizers.base import RaggedTokens
from preprocess.tokenizers.giga import GigatokenTokenizer, wrap_each
from preprocess.tokenizers.huggingface import HFTokenizersTokenizer
from preprocess_testing import GPT2_MERGES, GPT2_VOCAB, TOKENIZERS, sample_texts

transformers = pytest.importorskip("transformers")

HARD_TEXTS = [
    "日本語のテキスト、中文文本。한국어 텍스트",
    "emoji 😀👍🏽 family 👨\u200d👩\u200d👧 flags 🇫🇷",
    "e\u0301 cafe\u0301 Å ﬁ ǅ",
    "ctl\x00\x01\x07\x1b[0m\x7f end",
    "   many   spaces\n\n\n\nnewlines\t\ttabs \r\n\r\n  ",
    "\u2028line sep\u2029para\u00a0nbsp\u200bzero-width",
    "Arabic العربية Hebrew עברית Devanagari देवनागरी",
    "∀x∈ℝ: x² ≥ 0 — «quotes» “curly” ‘single’",
    "<|endoftext|> in the middle <|endoftext|>text",
    "supercalifragilisticexpialidocious" * 30,
    "a" * 3000,
    "x" * 200 + " " + "1234567890" * 50,
    "",
    " ",
    "\n",
    "don't won't I'm you're they'll we've",
]
TEXTS = HARD_TEXTS + sample_texts()[:40]


def tokenizer_file(*parts: str) -> str:
    return os.path.join(TOKENIZERS, *parts)


def hub_directory(tmp_path, files: dict[str, str]) -> str:
    """A folder laid out as a Hugging Face model's (hub file name -> our file), which `from_pretrained` reads the
    same way in transformers 4 and 5 (their constructors name the vocabulary arguments differently)."""
    for name, source in files.items():
        shutil.copyfile(source, tmp_path / name)
    return str(tmp_path)


def test_gpt2_ids_equal_transformers_gpt2_tokenizer_fast(tmp_path):
    ours = build_tokenizer(TokenizerConfig(tokenizer_type="GPT2BPETokenizer", vocab_file=GPT2_VOCAB,
                                           merge_file=GPT2_MERGES))
    reference = transformers.GPT2TokenizerFast.from_pretrained(
        hub_directory(tmp_path, {"vocab.json": GPT2_VOCAB, "merges.txt": GPT2_MERGES}))
    assert (ours.vocab_size, ours.eod, ours.pad) == (50257, 50256, None)
    for text in TEXTS:
        assert ours.encode(text) == reference(text).input_ids, text[:40]
    batch = ours.encode_batch(TEXTS)
    for i, text in enumerate(TEXTS):
        assert batch.tokens[batch.offsets[i]:batch.offsets[i + 1]].tolist() == reference(text).input_ids
    assert ours.decode(ours.encode(HARD_TEXTS[0])) == HARD_TEXTS[0]


@pytest.mark.parametrize("kind", ["BertWordPieceLowerCase", "BertWordPieceCase"])
def test_wordpiece_ids_equal_bert_tokenizer_fast(kind, tmp_path):
    vocab = tokenizer_file("wordpiece-vocab.txt")
    ours = build_tokenizer(TokenizerConfig(tokenizer_type=kind, vocab_file=vocab))
    reference = transformers.BertTokenizerFast.from_pretrained(hub_directory(tmp_path, {"vocab.txt": vocab}),
                                                               do_lower_case=kind == "BertWordPieceLowerCase")
    assert ours.vocab_size == len(reference)
    assert (ours.eod, ours.pad) == (reference.sep_token_id, reference.pad_token_id)
    batch = ours.encode_batch(TEXTS)
    for i, text in enumerate(TEXTS):
        expected = reference(text, add_special_tokens=False).input_ids
        assert ours.encode(text) == expected
        assert batch.tokens[batch.offsets[i]:batch.offsets[i + 1]].tolist() == expected


@pytest.mark.parametrize("model", ["sp-unigram.model", "sp-bpe.model"])
def test_gpt_sentencepiece_ids_equal_sentencepiece(model):
    path = tokenizer_file(model)
    ours = build_tokenizer(TokenizerConfig(tokenizer_type="GPTSentencePieceTokenizer", tokenizer_model=path))
    reference = sentencepiece.SentencePieceProcessor(model_file=path)
    assert (ours.vocab_size, ours.eod) == (reference.get_piece_size(), reference.eos_id())
    batch = ours.encode_batch(TEXTS + ["<s> and </s> are plain text here"])
    for i, text in enumerate(TEXTS + ["<s> and </s> are plain text here"]):
        assert batch.tokens[batch.offsets[i]:batch.offsets[i + 1]].tolist() == reference.encode_as_ids(text)


def test_sentencepiece_bpe_takes_the_gigatoken_fast_path():
    ours = build_tokenizer(TokenizerConfig(tokenizer_type="GPTSentencePieceTokenizer",
                                           tokenizer_model=tokenizer_file("sp-bpe.model")))
    assert isinstance(ours, GigatokenTokenizer)


def test_megatron_sentencepiece_adds_special_pieces_and_cuts_text_at_them():
    path = tokenizer_file("sp-unigram.model")
    ours = build_tokenizer(TokenizerConfig(tokenizer_type="SentencePieceTokenizer", tokenizer_model=path))
    reference = sentencepiece.SentencePieceProcessor(model_file=path)
    size = reference.get_piece_size()
    # <CLS> <SEP> <EOD> <MASK> and a <PAD> (the model has none) come after the model's pieces.
    assert ours.vocab_size == size + 5
    assert ours.eod == size + 2
    text = "first part<EOD>second<MASK> third"
    expected = (reference.encode_as_ids("first part") + [size + 2] + reference.encode_as_ids("second")
                + [size + 3] + reference.encode_as_ids(" third"))
    assert ours.encode(text) == expected
    batch = ours.encode_batch([text, "plain"])
    assert batch.tokens.tolist() == expected + reference.encode_as_ids("plain")


def test_huggingface_bpe_adds_bos_like_transformers_and_uses_gigatoken():
    directory = tokenizer_file("hf-bpe")
    ours = build_tokenizer(TokenizerConfig(tokenizer_type="HuggingFaceTokenizer", tokenizer_model=directory))
    reference = transformers.AutoTokenizer.from_pretrained(directory)
    assert isinstance(ours, GigatokenTokenizer)
    assert (ours.vocab_size, ours.eod, ours.pad) == (len(reference), reference.eos_token_id, reference.pad_token_id)
    batch = ours.encode_batch(TEXTS)
    for i, text in enumerate(TEXTS):
        assert batch.tokens[batch.offsets[i]:batch.offsets[i + 1]].tolist() == reference(text).input_ids


def test_huggingface_without_special_tokens():
    directory = tokenizer_file("hf-bpe")
    ours = build_tokenizer(TokenizerConfig(tokenizer_type="HuggingFaceTokenizer", tokenizer_model=directory,
                                           tokenizer_hf_include_special_tokens=False))
    reference = transformers.AutoTokenizer.from_pretrained(directory)
    for text in TEXTS:
        assert ours.encode(text) == reference(text, add_special_tokens=False).input_ids


def test_huggingface_wordpiece_json_uses_the_tokenizers_library():
    path = tokenizer_file("hf-wordpiece", "tokenizer.json")
    ours = build_tokenizer(TokenizerConfig(tokenizer_type="HuggingFaceTokenizer", tokenizer_model=path))
    reference = transformers.AutoTokenizer.from_pretrained(os.path.dirname(path))
    assert isinstance(ours, HFTokenizersTokenizer)
    assert ours.eod == reference.convert_tokens_to_ids("[SEP]")
    batch = ours.encode_batch(TEXTS)
    for i, text in enumerate(TEXTS):
        assert batch.tokens[batch.offsets[i]:batch.offsets[i + 1]].tolist() == reference(text).input_ids


def test_null_tokenizer_reads_integers():
    ours = build_tokenizer(TokenizerConfig(tokenizer_type="NullTokenizer", vocab_size=1000))
    assert (ours.vocab_size, ours.eod, ours.pad) == (1000, 999, None)
    assert ours.encode(" 5 17\n 3 ") == [5, 17, 3]
    batch = ours.encode_batch(["1 2", "", "7"])
    assert batch.tokens.tolist() == [1, 2, 7] and batch.offsets.tolist() == [0, 2, 2, 3]
    assert ours.decode(np.array([1, 2])) == "1 2"


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (dict(tokenizer_type="GPT2BPETokenizer", vocab_file="missing.json", merge_file=GPT2_MERGES), "missing.json"),
        (dict(tokenizer_type="BertWordPieceCase", vocab_file="missing.txt"), "missing.txt"),
        (dict(tokenizer_type="GPTSentencePieceTokenizer", tokenizer_model="missing.model"), "missing.model"),
        (dict(tokenizer_type="HuggingFaceTokenizer", tokenizer_model="org/not-on-disk"), "nothing is downloaded"),
    ],
)
def test_missing_files_are_one_clear_error_never_a_download(fields, message):
    with pytest.raises(TokenizerError, match=message):
        build_tokenizer(TokenizerConfig(**fields))


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (dict(tokenizer_type="Unknown"), "not one of"),
        (dict(tokenizer_type="GPT2BPETokenizer", vocab_file=GPT2_VOCAB), "needs merge_file"),
        (dict(tokenizer_type="NullTokenizer"), "needs vocab_size"),
        (dict(tokenizer_type="GPT2BPETokenizer", vocab_file=GPT2_VOCAB, merge_file=GPT2_MERGES, vocab_size=5),
         "vocab_size is not used"),
        (dict(tokenizer_type="NullTokenizer", vocab_size=0), "vocab_size must be >= 1"),
        (dict(tokenizer_type="NullTokenizer", vocab_size=5, tokenizer_hf_include_special_tokens=False),
         "only applies to HuggingFaceTokenizer"),
    ],
)
def test_config_rejects_options_that_would_have_no_effect(fields, message):
    with pytest.raises(ValueError, match=message):
        TokenizerConfig(**fields)


def test_gpt_sentencepiece_without_a_pad_piece_has_no_pad():
    sp = build_tokenizer(TokenizerConfig(tokenizer_type="GPTSentencePieceTokenizer",
                                         tokenizer_model=tokenizer_file("sp-unigram.model")))
    assert sp.pad is None


def test_wrap_each_puts_special_ids_around_every_text():
    encoded = RaggedTokens(np.array([5, 6, 7], dtype=np.uint32), np.array([0, 2, 2, 3]))
    wrapped = wrap_each(encoded, np.array([1], np.uint32), np.array([8, 9], np.uint32))
    assert wrapped.tokens.tolist() == [1, 5, 6, 8, 9, 1, 8, 9, 1, 7, 8, 9]
    assert wrapped.offsets.tolist() == [0, 5, 8, 12]
