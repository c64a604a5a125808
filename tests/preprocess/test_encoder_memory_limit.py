"""Encoder processes are replaced before they pass `--encoder-memory-limit-mb`, and ids never change (issue 19)."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import pytest

from preprocess import PreprocessConfig, cli, preprocess_data
from preprocess.tokenizers import TokenizerConfig
from preprocess.workers import projected_bytes

from preprocess_testing import GOLDEN, GPT2_FLAGS, GPT2_MERGES, GPT2_VOCAB, REPO, SAMPLE, same_dataset, sample_texts

GPT2 = TokenizerConfig(tokenizer_type="GPT2BPETokenizer", vocab_file=GPT2_VOCAB, merge_file=GPT2_MERGES)
GOLDEN_EOD = f"{GOLDEN}/sample_en_eod_text_document"
MIB = 2**20
REPLACED = "replacing it with a fresh one"
STARTED = "starting an encoder process to take over"


def _replacements(caplog) -> list[str]:
    return [record.getMessage() for record in caplog.records if REPLACED in record.getMessage()]


@pytest.mark.parametrize(("workers", "chunk_bytes"), [(1, 100_000), (2, 200_000)])
def test_past_the_limit_every_encoder_is_replaced_and_the_ids_stay_megatrons(tmp_path, caplog, workers, chunk_bytes):
    # A 1 MB limit: every encoder process is past it as soon as it reports, so each one encodes only the
    # chunks it already holds, and the run crosses many replacements.
    config = PreprocessConfig(input=SAMPLE, output_prefix=str(tmp_path / "limited"), tokenizer=GPT2,
                              append_eod=True, workers=workers, chunk_bytes=chunk_bytes, encoder_memory_limit_mb=1)
    with caplog.at_level(logging.INFO, logger="preprocess.workers"):
        preprocess_data(config)
    replacements = _replacements(caplog)
    assert len(replacements) >= 2
    assert "limit 1 MB, --encoder-memory-limit-mb" in replacements[0]
    assert same_dataset(str(tmp_path / "limited_text_document"), GOLDEN_EOD)


def _tree_bytes(directory) -> dict[str, bytes]:
    """Every file under `directory` (relative path -> bytes), the done marker's folder excepted."""
    return {str(path.relative_to(directory)): path.read_bytes() for path in sorted(directory.rglob("*"))
            if path.is_file() and "_done" not in str(path.relative_to(directory))}


def test_a_run_without_encoder_processes_gives_the_same_bytes_in_every_format(tmp_path, caplog):
    formats = ["--output-format", "mmap", "arrow", "mindrecord"]
    limited = ["--encoder-memory-limit-mb", "1", "--chunk-bytes", "150000"]
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with caplog.at_level(logging.INFO, logger="preprocess.workers"):
        argv = ["--input", SAMPLE, "--output-prefix", str(tmp_path / "a" / "out"), *GPT2_FLAGS, *formats, *limited]
        assert cli.main(argv) == 0
        assert STARTED in caplog.text and _replacements(caplog)
        caplog.clear()
        # Under the default limit this process encodes 1 MB of text itself: no encoder process starts.
        assert cli.main(["--input", SAMPLE, "--output-prefix", str(tmp_path / "b" / "out"), *GPT2_FLAGS, *formats]) == 0
        assert STARTED not in caplog.text and _replacements(caplog) == []
    limited_files, plain_files = _tree_bytes(tmp_path / "a"), _tree_bytes(tmp_path / "b")
    assert len(plain_files) >= 5 and limited_files == plain_files


def test_an_encoder_is_projected_to_take_one_more_cache_step_of_up_to_0_6_of_its_growth():
    assert projected_bytes(resident=280 * MIB, start=130 * MIB) == 370 * MIB
    assert projected_bytes(resident=130 * MIB, start=130 * MIB) == 130 * MIB


def test_the_limit_must_be_positive(tmp_path, capsys):
    argv = ["--input", SAMPLE, "--output-prefix", str(tmp_path / "out"), *GPT2_FLAGS, "--encoder-memory-limit-mb", "0"]
    assert cli.main(argv) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and "encoder_memory_limit_mb must be >= 1" in error[0]


def _make_corpus(*argv) -> subprocess.CompletedProcess:
    """Run benchmarks/make_adversarial_corpus.py as the README does (tests do not import the benchmarks)."""
    return subprocess.run([sys.executable, "-m", "benchmarks.make_adversarial_corpus", *map(str, argv)],
                          cwd=REPO, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": REPO})


def test_the_adversarial_corpus_is_made_of_distinct_random_words(tmp_path):
    out = tmp_path / "random.jsonl"
    assert _make_corpus("random", out, 300_000).returncode == 0
    with open(out, encoding="utf-8") as f:
        words = [word for line in f for word in json.loads(line)["text"].split(" ")]
    assert out.stat().st_size >= 300_000 and len(words) > 20_000 and len(set(words)) == len(words)
    assert all(6 <= len(word) <= 12 and word.isascii() and word.isalpha() for word in words)
    again = tmp_path / "again.jsonl"
    assert _make_corpus("random", again, 300_000).returncode == 0
    assert again.read_bytes() == out.read_bytes()  # a fixed seed


def test_the_varied_corpus_repeats_the_text_with_new_words_and_stays_valid_json(tmp_path):
    original = sample_texts()
    source, out = tmp_path / "corpus.jsonl", tmp_path / "varied.jsonl"
    source.write_text("".join(json.dumps({"text": text}) + "\n" for text in original))  # make_corpus.py's lines
    assert _make_corpus("varied", source, out, 3 * source.stat().st_size).returncode == 0
    with open(out, encoding="utf-8") as f:
        varied = [json.loads(line)["text"] for line in f]  # every line parses
    copies = [varied[i : i + len(original)] for i in range(0, len(varied), len(original))]
    assert len(copies) == 3 and copies[0] == original
    for copy in copies[1:]:
        assert copy != original and [len(text) for text in copy] == [len(text) for text in original]


def test_the_varied_corpus_refuses_a_source_in_another_layout(tmp_path):
    run = _make_corpus("varied", SAMPLE, tmp_path / "varied.jsonl", 10**6)
    assert run.returncode == 1 and run.stderr == f"{SAMPLE}: expected make_corpus.py's lines " + \
        '({"text": "...), each ending with a newline\n'
