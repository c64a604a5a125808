"""Every numeric ``train`` flag has a valid range, checked before anything starts: one line each.

The attacks are the ones that gave tracebacks or silently trained on nonsense (issue 18, section 5).
"""

import logging

import numpy as np
import pytest
from trainer_testing import argv_for, tiny_config

from indexed_dataset import IndexedDataset, IndexedDatasetWriter
from trainer.cli.train import main


def run_failing(argv, capsys) -> str:
    assert main(argv) != 0
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("train: error: ")
    return lines[0].removeprefix("train: error: ")


@pytest.fixture()
def tiny_argv(tiny_prefix, cache_dir):
    return argv_for(tiny_config(tiny_prefix, cache_dir))


@pytest.mark.parametrize(("flags", "expected"), [
    (["--adam-beta1", "1.5"], "--adam-beta1 must be in [0, 1), got 1.5"),
    (["--adam-beta1", "1.0"], "--adam-beta1 must be in [0, 1), got 1.0"),
    (["--adam-beta2", "-0.1"], "--adam-beta2 must be in [0, 1), got -0.1"),
    (["--adam-eps", "-1"], "--adam-eps must be > 0, got -1.0"),
    (["--init-method-std", "-0.02"], "--init-method-std must be > 0, got -0.02"),
    (["--seed", "-1"], "--seed must be in [0, 4294967295], got -1"),
    (["--seed", str(2**70)], f"--seed must be in [0, 4294967295], got {2**70}"),
    (["--master-port", "70000"], "--master-port must be in [0, 65535], got 70000"),
    (["--min-lr=-0.001"], "--min-lr must be >= 0, got -0.001"),
    (["--split=-1,50,51"], "--split entries must be >= 0 with a positive sum, got '-1,50,51'"),
    (["--split", "0,0,0"], "split '0,0,0': the numbers must not all be zero"),
    (["--lr-warmup-iters", "-5"], "--lr-warmup-iters must be >= 0, got -5"),
    (["--lr-warmup-fraction", "1.5"], "--lr-warmup-fraction must be in [0, 1], got 1.5"),
    (["--lr-warmup-fraction=-0.5"], "--lr-warmup-fraction must be in [0, 1], got -0.5"),
    (["--lr-warmup-iters", "20", "--lr-decay-iters", "20"],
     "the warm-up (20 steps) must be shorter than the decay (--lr-decay-iters, default --train-iters: 20 steps)"),
    (["--lr-warmup-iters", "0", "--lr-warmup-fraction", "1.0"],
     "the warm-up (20 steps) must be shorter than the decay (--lr-decay-iters, default --train-iters: 20 steps)"),
    (["--weight-decay", "-0.1"], "--weight-decay must be >= 0, got -0.1"),
    (["--layernorm-epsilon", "-1"], "--layernorm-epsilon must be > 0, got -1.0"),
    (["--clip-grad", "-1"], "--clip-grad must be >= 0, got -1.0"),
    (["--hidden-dropout", "1"], "--hidden-dropout must be in [0, 1), got 1.0"),
    (["--dist-timeout", "0"], "--dist-timeout must be >= 1, got 0"),
    (["--mask-prob", "0"], "--mask-prob must be in (0, 1), got 0.0"),
])
def test_out_of_range_flags_are_one_line_before_anything_starts(tiny_argv, flags, expected, capsys):
    assert run_failing(tiny_argv + flags, capsys) == expected


def test_negative_token_ids_are_one_line(golden, tiny_argv, tmp_path, capsys):
    """An int32 token file holding negative ids (ids index the embedding: torch would raise IndexError)."""
    source = IndexedDataset(str(golden / "sample_en_eod_text_document"))
    tokens = (source.tokens % 256).astype(np.int32)
    tokens[::50] = -7  # in every sample
    prefix = str(tmp_path / "negative_text_document")
    with IndexedDatasetWriter(prefix, np.int32) as writer:
        writer.add_documents(tokens, source.sequence_lengths.astype(np.int64), np.diff(source.document_indices))
    argv = tiny_argv + ["--dataset", prefix, "--data-cache-path", str(tmp_path / "cache"), "--train-iters", "1"]
    assert run_failing(argv, capsys).startswith("the data holds token id -7, but token ids are >= 0")


def test_a_split_without_valid_share_warns_that_evaluation_never_runs(tiny_argv, caplog):
    """`--split 100,0,0 --eval-interval 1` trains (as Megatron) and says once that it never evaluates."""
    argv = tiny_argv + ["--split", "100,0,0", "--eval-interval", "1", "--eval-iters", "1", "--train-iters", "1"]
    with caplog.at_level(logging.WARNING, logger="trainer.cli.train"):
        assert main(argv) == 0
    warnings = [r.getMessage() for r in caplog.records if r.name == "trainer.cli.train"]
    assert warnings == ["warning: --split 100,0,0 gives the valid split no data, so no evaluation runs "
                        "(--eval-interval 1 has no effect); set --eval-iters 0 to say so"]
