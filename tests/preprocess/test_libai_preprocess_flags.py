"""LiBai's `tools/preprocess_data.py` command line runs unchanged, with LiBai's Chinese whole-word ids.

LiBai's guide (docs "Preprocessing Dataset", its mmap variant of `--dataset-impl`) types:

    python tools/preprocess_data.py --input path/to/test_sample_cn.json --json-keys text \\
        --vocab-file path/to/bert-base-chinese-vocab.txt --dataset-impl mmap --tokenizer-name BertTokenizer \\
        --do-lower-case --do-chinese-wwm --split-sentences --output-prefix cn_samples_mmap \\
        --workers 1 --log-interval 2

`preprocess-data` takes the same words: `--tokenizer-name BertTokenizer --do-lower-case` is our
BertWordPieceLowerCase, and `--do-chinese-wwm` writes every Chinese character that continues a jieba word of
up to 3 characters as its `##X` id (LiBai's `get_new_segment`), which whole-word masking groups.
"""

from __future__ import annotations

import os
import tempfile

import numpy as np
import pytest
from preprocess_testing import DATA, GPT2_MERGES, GPT2_VOCAB, SAMPLE, same_dataset, write_jsonl

from preprocess.cli import build_parser, main
from preprocess.tokenizers import TokenizerConfig, build_tokenizer
from preprocess.tokenizers.flags import tokenizer_config_from_args
from samplers.bert.masking import MaskingOptions, word_candidates

CHINESE_VOCAB = os.path.join(DATA, "squad", "chinese-vocab.txt")
# Continuation pieces added to the bundled vocabulary; "##流" is left out on purpose (fallback to 流).
CONTINUATION_PIECES = ("##江", "##国", "##长", "##宫")
# jieba: 长江 / 是 / 中国 / 最长 / 的 / 河流 / 。 and 故宫 / 是 / 明清两代 / 的 / 皇宫 / 。
SENTENCE = "长江是中国最长的河流。故宫是明清两代的皇宫。"
# By hand, LiBai's algorithm: continuation characters of words of <= 3 characters become ##X; 河流's ##流 is not
# in the vocabulary (plain 流); 明清两代 has 4 characters, so it keeps plain characters.
EXPECTED_PIECES = ["长", "##江", "是", "中", "##国", "最", "##长", "的", "河", "流", "。",
                   "故", "##宫", "是", "明", "清", "两", "代", "的", "皇", "##宫", "。"]


@pytest.fixture(autouse=True)
def jieba_cache_in_tmp(tmp_path, monkeypatch):
    """jieba caches its dictionary in the temporary directory: keep it inside tmp_path (child processes too)."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))


@pytest.fixture
def vocab(tmp_path):
    """The bundled Chinese vocabulary plus a few `##X` continuation pieces; returns (path, piece -> id)."""
    with open(CHINESE_VOCAB, encoding="utf-8") as f:
        pieces = f.read().splitlines() + list(CONTINUATION_PIECES)
    path = tmp_path / "vocab.txt"
    path.write_text("\n".join(pieces) + "\n", encoding="utf-8")
    return str(path), {piece: index for index, piece in enumerate(pieces)}


def libai_command_line(input_path, vocab_file, prefix):
    return ["--input", input_path, "--json-keys", "text", "--vocab-file", vocab_file, "--dataset-impl", "mmap",
            "--tokenizer-name", "BertTokenizer", "--do-lower-case", "--do-chinese-wwm", "--split-sentences",
            "--output-prefix", prefix, "--workers", "1", "--log-interval", "2"]


def test_chinese_wwm_writes_word_continuations_as_continuation_ids(vocab):
    vocab_file, ids = vocab
    plain = build_tokenizer(TokenizerConfig(tokenizer_type="BertWordPieceLowerCase", vocab_file=vocab_file))
    wwm = build_tokenizer(TokenizerConfig(tokenizer_type="BertWordPieceLowerCase", vocab_file=vocab_file,
                                          chinese_wwm=True))
    assert wwm.encode(SENTENCE) == [ids[piece] for piece in EXPECTED_PIECES]
    assert plain.encode(SENTENCE) == [ids[piece.removeprefix("##")] for piece in EXPECTED_PIECES]
    assert wwm.encode("Hello 中国") == [ids["[UNK]"], ids["中"], ids["##国"]]  # only Chinese pieces change


def test_whole_word_masking_sees_the_jieba_words(vocab):
    vocab_file, ids = vocab
    wwm = build_tokenizer(TokenizerConfig(tokenizer_type="BertWordPieceLowerCase", vocab_file=vocab_file,
                                          chinese_wwm=True))
    continuation = np.array([piece.startswith("##") for piece in ids], dtype=bool)
    options = MaskingOptions(cls_id=ids["[CLS]"], sep_id=ids["[SEP]"], mask_id=ids["[MASK]"],
                             continuation=continuation, random_token_count=len(ids))
    words = word_candidates(wwm.encode("长江是中国最长的河流。"), options)
    assert words == [[0, 1], [2], [3, 4], [5, 6], [7], [8], [9], [10]]


def test_libai_command_line_writes_what_our_spelling_writes(tmp_path, vocab):
    vocab_file, _ = vocab
    corpus = write_jsonl(str(tmp_path / "test_sample_cn.json"),
                         [{"text": SENTENCE}, {"text": "北京是中国的首都。Hello World!"}, {"text": ""}])
    libai = str(tmp_path / "cn_samples_mmap")
    ours = str(tmp_path / "ours")
    assert main(libai_command_line(corpus, vocab_file, libai)) == 0
    assert main(["--input", corpus, "--output-prefix", ours, "--tokenizer-type", "BertWordPieceLowerCase",
                 "--vocab-file", vocab_file, "--do-chinese-wwm", "--split-sentences"]) == 0
    assert same_dataset(libai + "_text_sentence", ours + "_text_sentence")


def test_oneflow_gpt_guide_and_libai_gpt2_spelling_write_the_same_bytes(tmp_path):
    """shared/seeds/001 (OneFlow GPT) types Megatron's flags; LiBai's GPT2Tokenizer spelling means the same."""
    guide = str(tmp_path / "gpt_sample_dataset")
    libai = str(tmp_path / "libai")
    assert main(["--input", SAMPLE, "--output-prefix", guide, "--vocab", GPT2_VOCAB, "--dataset-impl", "mmap",
                 "--tokenizer-type", "GPT2BPETokenizer", "--merge-file", GPT2_MERGES, "--append-eod"]) == 0
    assert main(["--input", SAMPLE, "--output-prefix", libai, "--tokenizer-name", "GPT2Tokenizer",
                 "--vocab-file", GPT2_VOCAB, "--merges-file", GPT2_MERGES, "--append-eod"]) == 0
    assert same_dataset(guide + "_text_document", libai + "_text_document")


@pytest.mark.parametrize("libai, ours", [
    (["--tokenizer-name", "BertTokenizer", "--do-lower-case", "--vocab-file", "v.txt"],
     dict(tokenizer_type="BertWordPieceLowerCase", vocab_file="v.txt")),
    (["--tokenizer-name", "BertTokenizer", "--vocab-file", "v.txt", "--do-chinese-wwm"],
     dict(tokenizer_type="BertWordPieceCase", vocab_file="v.txt", chinese_wwm=True)),
    (["--tokenizer-name", "GPT2Tokenizer", "--vocab-file", "vocab.json", "--merges-file", "merges.txt"],
     dict(tokenizer_type="GPT2BPETokenizer", vocab_file="vocab.json", merge_file="merges.txt")),
    (["--tokenizer-name", "T5Tokenizer", "--vocab-file", "spiece.model"],
     dict(tokenizer_type="GPTSentencePieceTokenizer", tokenizer_model="spiece.model")),
])
def test_libai_tokenizer_names_are_our_tokenizer_types(libai, ours):
    args = build_parser().parse_args(["--input", "x.json", "--output-prefix", "out", *libai])
    assert tokenizer_config_from_args(args) == TokenizerConfig(**ours)


def exit_code(argv):
    """`main`'s exit code, whether it returns it or argparse exits."""
    try:
        return main(argv)
    except SystemExit as exit:
        return exit.code


@pytest.mark.parametrize("flags, message", [
    (["--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", "a", "--merge-file", "b", "--do-chinese-wwm"],
     "--do-chinese-wwm) only applies to the WordPiece tokenizers"),
    (["--tokenizer-name", "GPT2Tokenizer", "--vocab-file", "a", "--merges-file", "b", "--do-lower-case"],
     "--do-lower-case only applies to --tokenizer-name BertTokenizer"),
    (["--tokenizer-type", "BertWordPieceCase", "--vocab-file", "a", "--do-lower-case"],
     "--do-lower-case goes with --tokenizer-name BertTokenizer"),
    (["--tokenizer-name", "RobertaTokenizer", "--vocab-file", "a", "--merges-file", "b"],
     "--tokenizer-name RobertaTokenizer is not supported"),
    (["--tokenizer-name", "BertTokenizer", "--vocab-file", "a", "--dataset-impl", "lazy"],  # the guide's IMPL=lazy
     "dataset_impl 'lazy' is not supported"),
    (["--tokenizer-name", "BertTokenizer", "--tokenizer-type", "BertWordPieceCase", "--vocab-file", "a"],
     "not allowed with argument"),
])
def test_misfitting_libai_flags_are_one_line(tmp_path, capsys, flags, message):
    corpus = write_jsonl(str(tmp_path / "c.json"), [{"text": "中国"}])
    assert exit_code(["--input", corpus, "--output-prefix", str(tmp_path / "out"), *flags]) == 2
    error = capsys.readouterr().err
    assert message in error and error.count("\n") == 1 and "Traceback" not in error
    assert sorted(os.listdir(tmp_path)) == ["c.json"]
