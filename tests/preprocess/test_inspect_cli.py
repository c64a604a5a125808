"""inspect-index: header facts, length statistics, validation, decoding, JSON; damaged files fail cleanly."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest

from indexed_dataset import IndexedDataset
from trainer.cli import inspect as inspect_cli
from indexed_dataset.inspect import inspect_dataset
from preprocess.tokenizers import TokenizerConfig, build_tokenizer
from preprocess_testing import GOLDEN, GPT2_FLAGS, GPT2_MERGES, GPT2_VOCAB, sample_texts

EOD_PREFIX = os.path.join(GOLDEN, "sample_en_eod_text_document")
SP_MODEL = os.path.join(os.path.dirname(GOLDEN), "tokenizers", "sp-unigram.model")
SP_FLAGS = ["--tokenizer-type", "SentencePieceTokenizer", "--tokenizer-model", SP_MODEL]


def test_report_matches_the_arrays():
    report = inspect_dataset(EOD_PREFIX + ".idx")
    dataset = IndexedDataset(EOD_PREFIX)
    lengths = dataset.sequence_lengths
    assert (report.format, report.version, report.dtype, report.sequences, report.documents) == (
        "mmap", "1", "uint16", 232, 232)
    assert report.tokens == int(lengths.sum()) and report.max_token_id == 50256
    assert report.sequence_lengths.min == lengths.min() and report.sequence_lengths.max == lengths.max()
    assert report.sequence_lengths.median == float(np.median(lengths))
    assert report.sequence_lengths.p99 == float(np.percentile(lengths, 99))
    sizes = {os.path.splitext(name)[1]: size for name, size in report.files.items()}
    assert sizes == {".bin": 2 * report.tokens, ".idx": 34 + 12 * 232 + 8 * 233}


def test_json_output_with_decoded_documents(capsys):
    argv = [EOD_PREFIX, "--json", "--validate", "--show", "1", "--docs", "5,17", *GPT2_FLAGS]
    assert inspect_cli.main(argv) == 0
    output = json.loads(capsys.readouterr().out)
    texts = sample_texts()
    assert output["valid"] is True and output["documents"] == 232
    assert output["decoded"] == {str(i): texts[i] + "<|endoftext|>" for i in (0, 5, 17)}


def test_text_output(capsys):
    assert inspect_cli.main([EOD_PREFIX]) == 0
    out = capsys.readouterr().out
    assert "dtype           uint16" in out and "documents       232 (0 empty)" in out


def test_decoding_needs_the_tokenizer_flags(capsys):
    assert inspect_cli.main([EOD_PREFIX, "--show", "2"]) == 2
    assert "needs the tokenizer flags" in capsys.readouterr().err


@pytest.fixture
def copy_of_golden(tmp_path):
    for ext in (".bin", ".idx"):
        shutil.copy(EOD_PREFIX + ext, tmp_path / ("data" + ext))
    return str(tmp_path / "data")


@pytest.mark.parametrize("flags", [[], ["--validate"], ["--json"], ["--docs", "0", *GPT2_FLAGS]])
def test_inconsistent_pointers_are_refused_with_or_without_validate(copy_of_golden, capsys, flags):
    with open(copy_of_golden + ".idx", "r+b") as f:
        f.seek(34 + 4 * 232 + 8 * 5)  # sequence 5's pointer
        f.write(np.int64(12345).tobytes())
    assert inspect_cli.main([copy_of_golden, *flags]) == 1
    captured = capsys.readouterr()
    error = captured.err.strip().splitlines()
    assert len(error) == 1 and "data.idx: sequence 5 points to byte 12345 (offset 1002)" in error[0]
    assert captured.out == ""


def test_a_negative_document_length_is_refused_without_validate(copy_of_golden, capsys):
    with open(copy_of_golden + ".idx", "r+b") as f:
        f.seek(34 + 4 * 7)  # sequence 7's length
        f.write(np.int32(-262732).tobytes())
    assert inspect_cli.main([copy_of_golden]) == 1
    assert "data.idx: sequence 7 has negative length -262732 (offset 62)" in capsys.readouterr().err


def test_decoding_an_id_outside_the_vocabulary_is_one_line(copy_of_golden, capsys):
    """GPT-2 ids decoded with a 1,000-id vocabulary: checked before the tokenizer sees them (gigatoken panics)."""
    null = ["--tokenizer-type", "NullTokenizer", "--vocab-size", "1000"]
    assert inspect_cli.main([copy_of_golden, "--docs", "3", *null]) == 1
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and "data: token id" in error[0] and "in document 3 is outside the tokenizer's " \
        "vocabulary [0, 1000)" in error[0]


def test_validate_checks_ids_against_the_tokenizer(copy_of_golden, capsys):
    null = ["--tokenizer-type", "NullTokenizer", "--vocab-size", "1000"]
    assert inspect_cli.main([copy_of_golden, "--validate", *null]) == 1
    assert "data: token id 2643 in document 0 is outside the tokenizer's vocabulary [0, 1000)" in capsys.readouterr().err


@pytest.mark.parametrize("damage", ["truncate_bin", "truncate_idx", "missing_bin"])
def test_damaged_or_missing_files_are_one_line(copy_of_golden, capsys, damage):
    if damage == "truncate_bin":
        os.truncate(copy_of_golden + ".bin", 100)
    elif damage == "truncate_idx":
        os.truncate(copy_of_golden + ".idx", 20)
    else:
        os.remove(copy_of_golden + ".bin")
    assert inspect_cli.main([copy_of_golden]) == 1
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and error[0].startswith("inspect-index: error: ") and copy_of_golden in error[0]


def test_document_out_of_range(capsys):
    assert inspect_cli.main([EOD_PREFIX, "--docs", "232", *GPT2_FLAGS]) == 1
    assert "document 232 out of range" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------ training view
def test_training_view_shows_the_samples_training_reads(copy_of_golden, tmp_path, capsys):
    from samplers import GPTDatasetConfig, build_gpt_datasets

    cache = str(tmp_path / "cache")
    argv = [copy_of_golden, "--json", "--seq-length", "64", "--split", "90,10,0", "--seed", "7",
            "--train-samples", "5000", "--samples", "0,3,-1", "--data-cache-path", cache, *GPT2_FLAGS]
    assert inspect_cli.main(argv) == 0
    view = json.loads(capsys.readouterr().out)["training"]
    train, valid, test = view["splits"]
    assert test is None
    config = GPTDatasetConfig(sequence_length=64, random_seed=7, blend=([copy_of_golden], None), split="90,10,0",
                              path_to_cache=cache)
    train_dataset, valid_dataset, _ = build_gpt_datasets(config, sizes=(5000, None, None))
    assert train["num_samples"] == len(train_dataset) >= 5000 and train["num_epochs"] > 1
    assert valid["num_samples"] == len(valid_dataset) and valid["num_epochs"] == 1
    for sample_id in ("0", "3", "-1"):
        item = train_dataset[int(sample_id) % len(train_dataset)]
        tokens = train["samples"][sample_id]["tokens"]
        assert tokens[:-1] == item["tokens"].tolist() and tokens[1:] == item["labels"].tolist()
    tokenizer = build_tokenizer(TokenizerConfig(tokenizer_type="GPT2BPETokenizer", vocab_file=GPT2_VOCAB,
                                                merge_file=GPT2_MERGES))
    assert train["samples"]["0"]["text"] == tokenizer.decode(train["samples"]["0"]["tokens"])


def test_training_view_text_output_without_tokenizer(copy_of_golden, tmp_path, capsys):
    argv = [copy_of_golden, "--seq-length", "32", "--split", "1,0,0", "--num-samples", "10", "0", "0",
            "--samples", "1", "--data-cache-path", str(tmp_path / "cache")]
    assert inspect_cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "training view   seq-length 32, split 1,0,0, seed 1234" in out
    assert "valid           absent" in out and "test            absent" in out
    sample = out.split("--- train sample 1 ---\n")[1].splitlines()[0].split()
    assert len(sample) == 33 and all(token.isdigit() for token in sample)


def test_training_view_defaults_to_the_training_cache_beside_the_data(copy_of_golden, tmp_path, capsys):
    assert inspect_cli.main([copy_of_golden, "--seq-length", "32", "--split", "1,0,0"]) == 0
    assert os.listdir(tmp_path / "index-cache")


def test_training_view_bad_split_is_one_line(copy_of_golden, tmp_path, capsys):
    argv = [copy_of_golden, "--seq-length", "32", "--split", "a,b", "--data-cache-path", str(tmp_path / "c")]
    assert inspect_cli.main(argv) != 0
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and error[0].startswith("inspect-index: error: ")


@pytest.fixture(scope="module")
def sentence_prefix(tmp_path_factory):
    """`preprocess-data --split-sentences` of the sample documents with Megatron's SentencePieceTokenizer."""
    from preprocess.cli import main as preprocess_data

    prefix = tmp_path_factory.mktemp("t5_view") / "en"
    assert preprocess_data(["--input", os.path.join(os.path.dirname(GOLDEN), "sample_en.jsonl"),
                            "--output-prefix", str(prefix), "--split-sentences", *SP_FLAGS, "--workers", "1"]) == 0
    return f"{prefix}_text_sentence"


def test_t5_training_view_shows_the_span_corrupted_samples_training_reads(sentence_prefix, tmp_path, capsys):
    from preprocess.tokenizers.t5 import t5_special_ids
    from samplers.t5.dataset import T5DatasetConfig, build_t5_datasets

    argv = [sentence_prefix, "--model", "t5", "--seq-length", "64", "--decoder-seq-length", "32", "--split", "98,2,0",
            "--samples", "0,-1", "--data-cache-path", str(tmp_path), "--json", *SP_FLAGS]
    assert inspect_cli.main(argv) == 0
    train_view, valid_view, test_view = json.loads(capsys.readouterr().out)["training"]["splits"]

    tokenizer = build_tokenizer(TokenizerConfig(tokenizer_type="SentencePieceTokenizer", tokenizer_model=SP_MODEL))
    special = t5_special_ids(tokenizer, "SentencePieceTokenizer", vocab_extra_ids=100)
    config = T5DatasetConfig(data_prefix=sentence_prefix, sentinel_ids=special.sentinels, pad_id=special.pad,
                             decoder_start_id=special.decoder_start, eos_id=special.eos, split="98,2,0",
                             encoder_seq_length=64, decoder_seq_length=32, path_to_cache=str(tmp_path))
    train = build_t5_datasets(config)[0]
    assert test_view is None and valid_view["num_samples"] > 0
    assert train_view["num_samples"] == len(train)
    first = train.view(0)
    sample = train_view["samples"]["0"]
    assert sample["encoder_input"] == first.encoder_input.tolist()
    assert sample["decoder_target"] == first.decoder_target.tolist()
    assert sample["encoder_text"].count("<extra_id_0>") == 1 and "<extra_id_0>" in sample["target_text"]


def test_t5_training_view_text_needs_a_tokenizer(sentence_prefix, tmp_path, capsys):
    assert inspect_cli.main([sentence_prefix, "--model", "t5", "--seq-length", "64", "--decoder-seq-length", "32",
                             "--data-cache-path", str(tmp_path), *SP_FLAGS]) == 0
    out = capsys.readouterr().out
    assert "training view   t5, encoder 64, decoder 32" in out and "input:  " in out and "target: <extra_id_0>" in out
    assert inspect_cli.main([sentence_prefix, "--model", "t5", "--seq-length", "64"]) == 1
    assert capsys.readouterr().err.strip() == ("inspect-index: error: --model t5 needs the tokenizer "
                                               "(its pad, EOS and sentinel ids)")
