"""Crafted tokenizer files are refused in one line naming the file and the token or id (issue 26, issue 34).

Promised for every command that builds a tokenizer (`preprocess-data`, `train`, `generate`, all through
`preprocess.tokenizers.build_tokenizer`), as a user types it:

- a GPT-2 vocab.json whose ids are repeated, all 0, huge, negative or not integers, or that has no
  `<|endoftext|>`: exit != 0, one stderr line naming the vocab file and the token (never gigatoken's
  "Byte remapping failed" with a Rust location, never a huge allocation);
- a tokenizer_config.json whose `eos_token` is not a string (an int, a dict holding an int, a list): one line
  naming that file and `eos_token`;
- NullTokenizer ids past `--vocab-size` (or negative): one line naming the input line (preprocess-data) or
  the prompt (generate) and the id;

and nothing is written, no traceback, no hang (every command under a timeout).
"""

from __future__ import annotations

import json
import os
import shutil

import pytest
from cli_testing import assert_one_line, run_cli

from preprocess_testing import GPT2_MERGES, GPT2_VOCAB, SAMPLE, TOKENIZERS, write_jsonl

END_OF_TEXT = "<|endoftext|>"


def _gpt2_vocab() -> dict[str, int]:
    with open(GPT2_VOCAB, encoding="utf-8") as f:
        return json.load(f)


def _with(change) -> dict | list:
    vocab = _gpt2_vocab()
    return change(vocab) or vocab


# name -> (the crafted vocab.json content, what the error line must name besides the file).
BAD_VOCABS = {
    "repeated_id": (lambda v: v.update({"&": 4}), ("'&'", "id 4")),
    "all_ids_zero": (lambda v: {token: 0 for token in v}, ("id 0",)),
    "huge_id": (lambda v: v.update({"&": 10**12}), ("'&'", str(10**12))),
    "negative_id": (lambda v: v.update({"&": -3}), ("'&'", "-3")),
    "id_not_an_integer": (lambda v: v.update({"&": "x"}), ("'&'", "'x'")),
    "no_end_of_text": (lambda v: v.pop(END_OF_TEXT) and None, (END_OF_TEXT,)),
    "not_an_object": (lambda v: list(v), ("JSON object",)),
}


@pytest.fixture(scope="module")
def tiny_hf_gpt2(tmp_path_factory) -> str:
    """A one-layer Hugging Face GPT-2 folder with the GPT-2 vocabulary size (no tokenizer files in it)."""
    import transformers

    directory = tmp_path_factory.mktemp("hf") / "tiny"
    config = transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, n_positions=32, vocab_size=50257)
    transformers.GPT2LMHeadModel(config).save_pretrained(directory)
    return str(directory)


@pytest.fixture(scope="module")
def dataset_prefix(tmp_path_factory) -> str:
    """A small GPT-2 dataset for `train` runs."""
    directory = tmp_path_factory.mktemp("data")
    prefix = str(directory / "sample")
    code, err = run_cli("preprocess-data", "--input", SAMPLE, "--output-prefix", prefix, "--tokenizer-type",
                        "GPT2BPETokenizer", "--vocab-file", GPT2_VOCAB, "--merge-file", GPT2_MERGES, cwd=directory)
    assert code == 0, err
    return prefix + "_text_document"


def _train_argv(dataset: str, cache: str) -> list[str]:
    return ["--num-layers", "1", "--hidden-size", "16", "--num-attention-heads", "2", "--seq-length", "16",
            "--max-position-embeddings", "16", "--dataset", dataset, "--data-cache-path", cache,
            "--micro-batch-size", "1", "--global-batch-size", "1", "--train-iters", "1", "--device", "cpu",
            "--lr", "0.001", "--eval-iters", "0"]


def _command(command: str, tokenizer_flags: list[str], tmp_path, dataset_prefix, tiny_hf_gpt2) -> tuple[str, list]:
    if command == "preprocess-data":
        return command, ["--input", SAMPLE, "--output-prefix", str(tmp_path / "out"), *tokenizer_flags]
    if command == "train":
        return command, [*_train_argv(dataset_prefix, str(tmp_path / "cache")), *tokenizer_flags]
    return command, ["--load", tiny_hf_gpt2, "--prompt", "Hello", "--max-new-tokens", "1", "--device", "cpu",
                     *tokenizer_flags]


COMMANDS = ("preprocess-data", "train", "generate")


# Every case through preprocess-data; train and generate build the tokenizer the same way
# (`build_tokenizer`), so they run the cases the campaign found on them (each run costs seconds of imports).
VOCAB_RUNS = [(case, "preprocess-data") for case in sorted(BAD_VOCABS)] + [
    (case, command) for case in ("all_ids_zero", "no_end_of_text") for command in COMMANDS[1:]]
EOS_RUNS = [("dict_with_int", command) for command in COMMANDS] + [
    ("int", "preprocess-data"), ("list", "preprocess-data")]


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("case", "command"), VOCAB_RUNS)
def test_a_crafted_gpt2_vocab_is_one_line_naming_it(tmp_path, files_in, dataset_prefix, tiny_hf_gpt2, command, case):
    change, expected = BAD_VOCABS[case]
    vocab = tmp_path / "vocab.json"
    vocab.write_text(json.dumps(_with(change)), encoding="utf-8")
    flags = ["--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", str(vocab), "--merge-file", GPT2_MERGES]
    program, argv = _command(command, flags, tmp_path, dataset_prefix, tiny_hf_gpt2)
    before = files_in()
    assert_one_line(*run_cli(program, *argv, cwd=tmp_path), str(vocab), *expected)
    assert files_in() == before


# eos_token values that name no token.
BAD_EOS_TOKENS = {"dict_with_int": {"content": 5, "special": True}, "int": 5, "list": ["</s>"]}


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("case", "command"), EOS_RUNS)
def test_a_tokenizer_config_eos_token_that_is_not_a_string_is_one_line(tmp_path, files_in, dataset_prefix,
                                                                        tiny_hf_gpt2, command, case):
    directory = tmp_path / "tokenizer"
    shutil.copytree(os.path.join(TOKENIZERS, "hf-bpe"), directory)
    config = directory / "tokenizer_config.json"
    config.write_text(json.dumps({"eos_token": BAD_EOS_TOKENS[case]}), encoding="utf-8")
    flags = ["--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", str(directory)]
    program, argv = _command(command, flags, tmp_path, dataset_prefix, tiny_hf_gpt2)
    before = files_in()
    assert_one_line(*run_cli(program, *argv, cwd=tmp_path), str(config), "eos_token")
    assert files_in() == before


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("text", "outside"), [("1 2 1000", "1000"), ("7 -1", "-1"), ("999999", "999999")])
def test_null_tokenizer_ids_past_the_vocab_size_name_the_line(tmp_path, files_in, text, outside):
    source = write_jsonl(str(tmp_path / "in.jsonl"), [{"text": "1 2"}, {"text": text}])
    before = files_in()
    code, err = run_cli("preprocess-data", "--input", source, "--output-prefix", str(tmp_path / "out"),
                        "--tokenizer-type", "NullTokenizer", "--vocab-size", "1000", cwd=tmp_path)
    assert_one_line(code, err, "in.jsonl:2", f"id {outside}", "1000")
    assert files_in() == before


@pytest.mark.timeout(120)
def test_null_tokenizer_prompt_past_the_vocab_size_is_one_line(tmp_path, tiny_hf_gpt2):
    code, err = run_cli("generate", "--load", tiny_hf_gpt2, "--prompt", "1 2 60000", "--max-new-tokens", "1",
                        "--device", "cpu", "--tokenizer-type", "NullTokenizer", "--vocab-size", "50257", cwd=tmp_path)
    assert_one_line(code, err, "prompt 1", "id 60000")


@pytest.mark.timeout(120)
def test_the_real_gpt2_vocab_still_works(tmp_path):
    code, err = run_cli("preprocess-data", "--input", SAMPLE, "--output-prefix", str(tmp_path / "out"),
                        "--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", GPT2_VOCAB, "--merge-file",
                        GPT2_MERGES, cwd=tmp_path)
    assert code == 0, err
