"""Index arrays are sized before they are built (issue 34).

Promised:

- `gpt_index_bytes` is exactly the bytes `build_gpt_indices` returns (every dtype rule and length);
- `build-indices`, `inspect-index` and `train` asked for more samples than this machine's memory can index
  exit non-zero with one stderr line giving the estimate in GiB (never NumPy's MemoryError traceback), and
  write nothing into the index cache; a blend is refused the same way;
- so do the sentence-split kinds (T5 span corruption, BERT), at once: their builders walk epoch after epoch
  until the samples asked for are reached, which for such a count would take hours;
- an index cache the disk cannot hold is not written (one warning; the arrays stay in memory), instead of
  filling the disk.
"""

from __future__ import annotations

import logging
import os
import resource

import numpy as np
import pytest
from cli_testing import run_cli

from samplers import cache as cache_module
from samplers.bert.dataset import build_bert_datasets
from samplers.cache import IndexCache
from samplers.errors import IndexMemoryError
from samplers.gpt.indices import GPTIndexSpec, build_gpt_indices, gpt_index_bytes, plan_epochs
from samplers.t5.dataset import build_t5_datasets

# A regression must fail on a small allocation, not take the shared machine's memory: each command gets
# this address space.
ADDRESS_SPACE_BYTES = 8 * 2**30
# More samples than any machine's memory indexes (~2.5 TiB of arrays for the sample dataset).
HUGE_SAMPLES = "100000000000"

SPECS = {
    "one_epoch": dict(num_samples=None),
    "few_samples": dict(num_samples=10),
    "many_epochs": dict(num_samples=5000),
    "separate_final_epoch": dict(num_samples=260),
    "keep_partial_sample": dict(num_samples=None, drop_last_partial_sample=False),
    "no_extra_token": dict(num_samples=700, extra_tokens=0),
    "part_of_the_dataset": dict(num_samples=300, begin=100),
}


@pytest.mark.parametrize("case", sorted(SPECS))
def test_the_estimate_is_the_bytes_built(case):
    lengths = np.random.RandomState(0).randint(1, 60, size=400).astype(np.int32)
    spec = GPTIndexSpec(**{"begin": 0, "end": 400, "sequence_length": 32, "random_seed": 1, **SPECS[case]})
    arrays = build_gpt_indices(lengths, spec)
    assert gpt_index_bytes(len(lengths), spec, plan_epochs(lengths, spec)) == sum(a.nbytes for a in arrays.values())


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE_BYTES, ADDRESS_SPACE_BYTES))


def run_limited(program: str, *argv: str, cwd) -> tuple[int, str]:
    """`run_cli` under the address-space limit."""
    return run_cli(program, *argv, cwd=cwd, preexec_fn=_limit_memory)


def _build_indices(dataset: str, cache: str) -> tuple[str, list[str]]:
    return "build-indices", ["--data-path", dataset, "--seq-length", "1024", "--train-samples", HUGE_SAMPLES,
                             "--data-cache-path", cache]


def _build_indices_valid(dataset: str, cache: str) -> tuple[str, list[str]]:
    return "build-indices", ["--data-path", dataset, "--split", "90,10,0", "--seq-length", "64",
                             "--train-samples", "10", "--valid-samples", HUGE_SAMPLES, "--data-cache-path", cache]


def _build_indices_blend(dataset: str, cache: str) -> tuple[str, list[str]]:
    return "build-indices", ["--data-path", "0.5", dataset, "0.5", dataset, "--seq-length", "1024",
                             "--train-samples", HUGE_SAMPLES, "--data-cache-path", cache]


def _build_indices_run_length(dataset: str, cache: str) -> tuple[str, list[str]]:
    return "build-indices", ["--data-path", dataset, "--seq-length", "1024", "--train-iters", "100000000",
                             "--global-batch-size", "1024", "--data-cache-path", cache]


def _inspect_index(dataset: str, cache: str) -> tuple[str, list[str]]:
    return "inspect-index", [dataset, "--seq-length", "1024", "--train-samples", HUGE_SAMPLES,
                             "--data-cache-path", cache]


def _train(dataset: str, cache: str) -> tuple[str, list[str]]:
    return "train", ["--num-layers", "1", "--hidden-size", "16", "--num-attention-heads", "2", "--seq-length", "16",
                     "--max-position-embeddings", "16", "--vocab-size", "50304", "--dataset", dataset,
                     "--data-cache-path", cache, "--micro-batch-size", "1", "--global-batch-size", "1024",
                     "--train-iters", "100000000000", "--device", "cpu", "--lr", "0.001", "--eval-iters", "0"]


COMMANDS = {"build_indices": _build_indices, "build_indices_valid": _build_indices_valid,
            "build_indices_blend": _build_indices_blend, "build_indices_run_length": _build_indices_run_length,
            "inspect_index": _inspect_index, "train": _train}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", sorted(COMMANDS))
def test_more_samples_than_memory_holds_is_one_line_with_the_estimate(golden, tmp_path, case):
    cache = tmp_path / "cache"
    program, argv = COMMANDS[case](str(golden / "sample_en_eod_text_document"), str(cache))
    code, err = run_limited(program, *argv, cwd=tmp_path)
    assert code != 0
    assert "Traceback" not in err and "MemoryError" not in err, err
    errors = [line for line in err.strip().splitlines() if "error:" in line]
    assert len(errors) == 1 and err.strip().splitlines()[-1] == errors[0], err
    assert "GiB of memory" in errors[0] and "sample_en_eod_text_document" in errors[0], errors[0]
    # Nothing of the split asked too much of (an earlier split that fits may be cached).
    refused = "-valid-" if case == "build_indices_valid" else "-train-"
    assert not cache.exists() or not [name for name in os.listdir(cache) if refused in name]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["t5", "bert"])
def test_sentence_split_kinds_refuse_more_samples_than_memory_holds_before_walking(tmp_path, kind):
    from bert_golden import write_bert_corpus
    from test_bert_dataset import bert_config
    from test_t5_dataset import make_config, write_sentence_dataset

    cache = tmp_path / "cache"
    if kind == "t5":
        prefix = write_sentence_dataset(tmp_path / "corpus", 40, seed=0)
        build, config = build_t5_datasets, make_config(prefix, cache)
    else:
        prefix = write_bert_corpus(tmp_path / "corpus")
        build, config = build_bert_datasets, bert_config(prefix, cache)
    with pytest.raises(IndexMemoryError, match="GiB of memory") as refused:
        build(config, (int(HUGE_SAMPLES), None, None))
    assert prefix in str(refused.value) and "train" in str(refused.value)
    assert not cache.exists() or not [name for name in os.listdir(cache) if "-train" in name]


@pytest.mark.timeout(300)
def test_train_t5_asked_for_more_samples_than_memory_holds_is_one_line(data_test, tmp_path):
    from preprocess.cli import main as preprocess_data

    tokenizer = ["--tokenizer-type", "SentencePieceTokenizer",
                 "--tokenizer-model", str(data_test / "tokenizers" / "sp-unigram.model")]
    assert preprocess_data(["--input", str(data_test / "sample_en.jsonl"), "--output-prefix", str(tmp_path / "en"),
                            "--split-sentences", *tokenizer, "--workers", "1"]) == 0
    code, err = run_limited(
        "train", "--model", "t5", "--num-layers", "1", "--hidden-size", "16", "--num-attention-heads", "2",
        "--kv-channels", "8", "--ffn-hidden-size", "32", "--encoder-seq-length", "32", "--decoder-seq-length", "16",
        "--data-path", str(tmp_path / "en_text_sentence"), *tokenizer, "--micro-batch-size", "1",
        "--global-batch-size", "1024", "--train-samples", HUGE_SAMPLES, "--device", "cpu", "--lr", "0.001",
        "--eval-iters", "0", "--data-cache-path", str(tmp_path / "cache"), cwd=tmp_path)
    assert code != 0 and "Traceback" not in err, err
    assert err.strip().splitlines()[-1].startswith("train: error: "), err
    assert "T5 samples: the index arrays need" in err and "GiB of memory" in err, err


def test_an_index_cache_the_disk_cannot_hold_is_not_written(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(cache_module, "free_disk_bytes", lambda path: 10)
    arrays = {"a": np.arange(100, dtype=np.int64)}
    with caplog.at_level(logging.WARNING, logger="samplers.cache"):
        built = IndexCache(str(tmp_path / "cache")).load_or_build("x", {"k": 1}, ("a",), lambda: arrays)
    assert built is arrays
    assert "disk has" in caplog.text
    assert not (tmp_path / "cache").exists() or not os.listdir(tmp_path / "cache")
