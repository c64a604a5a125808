"""Megatron's ``--mock-data`` in ``train`` (issue 29, section 3): synthetic tokens with Megatron's meaning.

Promised, as a user types the commands:

- ``train --mock-data --tokenizer-type NullTokenizer --vocab-size N ...`` trains a tiny GPT without any data
  file: exit 0, finite train, valid and test losses, nothing written but the metrics file asked for;
  ``--split`` is accepted (Megatron's own mock examples pass ``--split '99,1,0'``) and, as in Megatron, the
  documents are divided 1,1,1 all the same, with a warning naming the ignored split;
- the run's GPT samples are megatron-core 0.16.1's `MockGPTDataset` items: the trainer's datasets for the
  NullTokenizer of the golden run equal tests/samplers/make_mock_gpt_golden.py's arrays
  (data_test/samplers/megatron_mock_gpt.npz), and a NullTokenizer's EOD is its last id, as Megatron's;
- GPT-2 tokenizer files give the vocabulary and the EOD instead;
- one line naming the flag, exit != 0, no traceback, nothing written: ``--mock-data`` with a data path
  (Megatron: a single data source), with ``--model t5`` or ``bert``, without an EOD id (``--vocab-size`` with
  no NullTokenizer nor tokenizer files), or without a vocabulary size.
"""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import numpy as np
import pytest

from trainer.config import DataConfig
from trainer.data.batches import Vocabulary, resolve_vocabulary
from trainer.models.gpt.data import build_datasets
from trainer_testing import train_in_process

GOLDEN_SCRIPT = Path(__file__).resolve().parents[1] / "samplers" / "make_mock_gpt_golden.py"
_spec = importlib.util.spec_from_file_location("make_mock_gpt_golden", GOLDEN_SCRIPT)
golden_script = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(golden_script)

VOCAB_SIZE = golden_script.VOCAB_SIZE
TINY_MODEL = ["--num-layers", "1", "--hidden-size", "16", "--num-attention-heads", "2", "--micro-batch-size", "2",
              "--global-batch-size", "4", "--device", "cpu"]
TINY_GPT = [*TINY_MODEL, "--seq-length", "32"]
NULL_TOKENIZER = ["--tokenizer-type", "NullTokenizer", "--vocab-size", str(VOCAB_SIZE)]


@pytest.fixture(scope="module")
def golden(data_test) -> dict[str, np.ndarray]:
    with np.load(data_test / "samplers" / "megatron_mock_gpt.npz") as arrays:
        return dict(arrays)


@pytest.mark.timeout(300)
def test_a_mock_data_run_trains_without_data_files(tmp_path, monkeypatch, capsys, caplog):
    monkeypatch.chdir(tmp_path)
    metrics = tmp_path / "metrics.jsonl"
    code, err = train_in_process(["--mock-data", *NULL_TOKENIZER, *TINY_GPT, "--train-iters", "3", "--eval-iters", "1",
                                  "--eval-interval", "2", "--log-interval", "1", "--split", "99,1,0",
                                  "--metrics-file", str(metrics)], capsys)
    assert code == 0, err
    assert "--split 99,1,0 has no effect with --mock-data" in caplog.text + "\n".join(err)
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    losses = [record["loss"] for record in records if "split" not in record]
    assert len(losses) == 3 and all(math.isfinite(loss) for loss in losses)
    evaluated = {record["split"] for record in records if "split" in record}
    assert evaluated == {"valid", "test"}
    assert sorted(path.name for path in tmp_path.iterdir()) == ["metrics.jsonl"]


def test_a_null_tokenizers_eod_is_its_last_id():
    data = DataConfig(mock_data=True, tokenizer_type="NullTokenizer")
    assert resolve_vocabulary(data, VOCAB_SIZE) == Vocabulary(size=VOCAB_SIZE, eod_id=VOCAB_SIZE - 1, pad_id=None)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", list(golden_script.CASES))
def test_the_runs_samples_are_megatron_cores_mock_items(case, golden):
    sequence_length, flags = golden_script.CASES[case]
    data = DataConfig(mock_data=True, tokenizer_type="NullTokenizer", seed=golden_script.SEED,
                      **{flag: True for flag in flags})
    vocabulary = resolve_vocabulary(data, VOCAB_SIZE)
    assert vocabulary.eod_id == golden_script.EOD_ID
    datasets = build_datasets(data, sequence_length, vocabulary, golden_script.SIZES)
    for split, dataset in zip(golden_script.SPLITS, datasets):
        key = f"{case}.{split}"
        assert len(dataset) == int(golden[f"{key}.length"])
        ids = [int(i) for i in golden[f"{key}.ids"]]
        for name in golden_script.ITEM_KEYS:
            ours = np.stack([dataset[i][name].numpy() for i in ids])
            assert np.array_equal(ours, golden[f"{key}.{name}"]), (split, name)


def test_gpt2_tokenizer_files_give_the_vocabulary_and_eod(data_test):
    data = DataConfig(mock_data=True, tokenizer_type="GPT2BPETokenizer", vocab_file=str(data_test / "gpt2" / "gpt2-vocab.json"),
                      merge_file=str(data_test / "gpt2" / "gpt2-merges.txt"))
    vocabulary = resolve_vocabulary(data, None)
    train, _, _ = build_datasets(data, 16, vocabulary, (4, 0, 0))
    documents = train.dataset
    assert (documents.vocab_size, documents.eod_id) == (50257, 50256)
    assert int(documents.get(0)[-1]) == 50256


@pytest.mark.timeout(120)
@pytest.mark.parametrize("extra, words", [
    (["--data-path", "data/x_text_document"], ["--mock-data", "--data-path", "single data source"]),
    (["--dataset", "data/x_text_document"], ["--mock-data", "--dataset", "single data source"]),
    (["--train-data-path", "data/x_text_document"], ["--mock-data", "--train-data-path"]),
    (["--model", "t5"], ["--mock-data", "does not apply to model t5"]),
    (["--model", "bert", "--seq-length", "32"], ["--mock-data", "does not apply to model bert"]),
    (["--vocab-size", str(VOCAB_SIZE), "--seq-length", "32"], ["--mock-data", "end-of-document", "NullTokenizer"]),
    (["--seq-length", "32"], ["vocabulary size is unknown"]),
], ids=["data-path", "dataset", "train-data-path", "t5", "bert", "no-eod", "no-vocabulary"])
def test_refusals_are_one_line(extra, words, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code, err = train_in_process(["--mock-data", *TINY_MODEL, "--train-iters", "1", "--save", str(tmp_path / "run"),
                                  *extra], capsys)
    assert code != 0
    assert len(err) == 1, err
    for word in words:
        assert word in err[0], err[0]
    assert list(tmp_path.iterdir()) == []
