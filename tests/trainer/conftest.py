"""Fixtures of the trainer tests: one intra-op thread, a small-vocabulary token file and the single-process
reference run."""

from pathlib import Path

import pytest
import torch
from process_testing import TEST_THREADS
from trainer_testing import result_record, tiny_config, write_tiny_dataset


@pytest.fixture(scope="session", autouse=True)
def one_thread_from_the_start():
    """`TEST_THREADS` before any session fixture of the trainer tests (the references) runs. Tests compare their
    in-process runs bit for bit with session-wide references computed in other tests: with the count left to
    whichever test ran last, such a comparison depended on the order the tests ran in. (On a shared 2-core machine
    one thread is also the faster for tiny matrices.)"""
    torch.set_num_threads(TEST_THREADS)


@pytest.fixture(autouse=True)
def one_thread(one_thread_from_the_start):
    """Whatever count a test sets, the next one starts with `TEST_THREADS`."""
    yield
    torch.set_num_threads(TEST_THREADS)


@pytest.fixture(scope="session")
def tiny_prefix(tmp_path_factory, golden) -> str:
    """The golden sample documents folded into a 256-token vocabulary."""
    directory = tmp_path_factory.mktemp("tiny_data")
    return write_tiny_dataset(str(golden / "sample_en_eod_text_document"), str(directory / "tiny_text_document"))


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("index_cache"))


@pytest.fixture(scope="session")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("trainer_runs")


@pytest.fixture(scope="session")
def reference(tiny_prefix, cache_dir) -> dict:
    """The single-process run every layout is compared with (evaluating one batch of valid and test)."""
    return result_record(tiny_config(tiny_prefix, cache_dir, eval_iters=1))


def _sentence_split(data_test, tmp_path_factory, folder: str, tokenizer: list[str]) -> str:
    """The sample documents, sentence-split by `preprocess-data` with the ``tokenizer`` flags; the prefix."""
    from preprocess.cli import main as preprocess_data

    prefix = tmp_path_factory.mktemp(folder) / "en"
    assert preprocess_data(["--input", str(data_test / "sample_en.jsonl"), "--output-prefix", str(prefix),
                            "--split-sentences", *tokenizer, "--workers", "1"]) == 0
    return f"{prefix}_text_sentence"


@pytest.fixture(scope="session")
def sentence_prefix(data_test, tmp_path_factory) -> str:
    """The sample documents, sentence-split with the SentencePiece test model (the T5 runs' data)."""
    return _sentence_split(data_test, tmp_path_factory, "t5_data", [
        "--tokenizer-type", "SentencePieceTokenizer",
        "--tokenizer-model", str(data_test / "tokenizers" / "sp-unigram.model")])


@pytest.fixture(scope="session")
def wordpiece_sentences(data_test, tmp_path_factory) -> str:
    """The sample documents, sentence-split with the WordPiece test vocabulary."""
    return _sentence_split(data_test, tmp_path_factory, "bert_data", [
        "--tokenizer-type", "BertWordPieceLowerCase",
        "--vocab-file", str(data_test / "tokenizers" / "wordpiece-vocab.txt")])


# The launch variables `train` takes its launch defaults from (CPM-Pretrain's and LiBai's scripts): a
# machine that happens to export one (PORT is common) must not change what the tests run.
LAUNCH_VARIABLES = ("GPUS_PER_NODE", "NNODES", "NODE", "NODE_RANK", "MASTER_ADDR", "ADDR", "MASTER_PORT", "PORT")


@pytest.fixture(autouse=True)
def _no_launch_variables(monkeypatch):
    for name in LAUNCH_VARIABLES:
        monkeypatch.delenv(name, raising=False)
