"""Megatron flags whose meaning was ours in other words (issue 29, section 2): the same command line means the
same run.

- ``--model t5`` and ``--model bert`` default ``--tokenizer-type`` to BertWordPieceLowerCase, as Megatron's
  pretrain_t5.py and pretrain_bert.py set it; gpt keeps GPT2BPETokenizer; a given ``--tokenizer-type`` wins.
- ``--optimizer adam`` is Megatron's spelling of decoupled AdamW: the same losses as ``--optimizer adamw``.
- ``--timing-log-level 2`` adds Megatron's level-2 forward-compute and backward-compute times to level 1's
  phases (log line and metrics file); a pipelined run keeps level 1's phases (``--help`` says why).
- ``--eval-interval``'s help says what Megatron does when it is not given.
"""

from __future__ import annotations

import dataclasses
import logging

import pytest
from trainer_testing import tiny_config

from trainer.cli.train import main
from trainer.cli.train_args import build_parser, config_from_args
from trainer.metrics.records import read_run
from trainer.metrics.writers import DETAILED_PHASES, PHASE_KEY_SUFFIX, TIMING_PHASES
from trainer.train import train

SHAPE = ["--num-layers", "2", "--hidden-size", "16", "--num-attention-heads", "4", "--vocab-size", "64"]


def parse(argv: list[str]):
    return config_from_args(build_parser().parse_args(argv))


@pytest.mark.parametrize("model", ["gpt", "t5", "bert"])
def test_the_flag_leaves_the_tokenizer_type_to_the_model(model):
    assert parse([*SHAPE, "--model", model]).data.tokenizer_type is None
    assert parse([*SHAPE, "--model", model, "--tokenizer-type", "BertWordPieceCase"]).data.tokenizer_type == \
        "BertWordPieceCase"


@pytest.mark.timeout(300)
def test_bert_without_tokenizer_type_reads_its_wordpiece_vocab_lower_cased(wordpiece_sentences, data_test,
                                                                           cache_dir, capsys):
    """Megatron's pretrain_bert.py (and pretrain_t5.py) default: BertWordPieceLowerCase; GPT2BPETokenizer
    (the old default of every model) would not read a WordPiece vocab.txt at all."""
    argv = ["--model", "bert", "--num-layers", "1", "--hidden-size", "16", "--num-attention-heads", "4",
            "--seq-length", "32", "--micro-batch-size", "2", "--global-batch-size", "2", "--train-iters", "1",
            "--dataset", wordpiece_sentences, "--split", "98,2,0", "--eval-iters", "0", "--device", "cpu",
            "--vocab-file", str(data_test / "tokenizers" / "wordpiece-vocab.txt"), "--data-cache-path", cache_dir]
    assert main(argv) == 0, capsys.readouterr().err


@pytest.mark.timeout(300)
def test_gpt_without_tokenizer_type_reads_gpt2_bpe_files(data_test, cache_dir, capsys):
    argv = ["--num-layers", "1", "--hidden-size", "16", "--num-attention-heads", "4", "--seq-length", "32",
            "--micro-batch-size", "2", "--global-batch-size", "2", "--train-iters", "1", "--eval-iters", "0",
            "--dataset", str(data_test / "megatron" / "sample_en_eod_text_document"), "--device", "cpu",
            "--vocab-file", str(data_test / "gpt2" / "gpt2-vocab.json"),
            "--merge-file", str(data_test / "gpt2" / "gpt2-merges.txt"), "--data-cache-path", cache_dir]
    assert main(argv) == 0, capsys.readouterr().err


@pytest.mark.timeout(300)
def test_optimizer_adam_is_decoupled_adamw(tiny_prefix, cache_dir):
    losses = {}
    for optimizer in ("adam", "adamw"):
        config = tiny_config(tiny_prefix, cache_dir, train_iters=3, num_layers=2, hidden_size=16)
        config.optimizer.optimizer = optimizer
        losses[optimizer] = train(config).losses
    assert losses["adam"] == losses["adamw"]


def test_optimizer_adam_is_accepted_on_the_command_line():
    assert parse([*SHAPE, "--optimizer", "adam"]).optimizer.optimizer == "adam"


@pytest.mark.timeout(300)
def test_timing_level_2_adds_forward_and_backward_compute(tiny_prefix, cache_dir, tmp_path, caplog):
    config = tiny_config(tiny_prefix, cache_dir, train_iters=2, num_layers=2, hidden_size=16,
                         metrics_file=str(tmp_path / "metrics.jsonl"))
    config = dataclasses.replace(config, logging=dataclasses.replace(config.logging, log_interval=2,
                                                                     timing_log_level=2))
    with caplog.at_level(logging.INFO, logger="trainer.metrics.writers"):
        train(config)
    (record,) = read_run(tmp_path / "metrics.jsonl").train
    timed = {phase: record[phase + PHASE_KEY_SUFFIX] for phase in {**TIMING_PHASES, **DETAILED_PHASES}}
    assert timed["forward_compute"] > 0 and timed["backward_compute"] > 0
    # Both are inside the forward-backward phase.
    assert timed["forward_compute"] + timed["backward_compute"] <= timed["forward_backward"]
    (line,) = [r.getMessage() for r in caplog.records if "lm loss:" in r.getMessage()]
    assert "forward-compute (ms):" in line and "backward-compute (ms):" in line


def test_help_says_what_level_2_and_megatrons_missing_eval_interval_mean():
    # (argparse wraps lines at hyphens too: compare without any whitespace.)
    text = "".join(build_parser().format_help().split())
    for words in ("level-2 forward-compute and backward-compute",
                  "Not given, Megatron-LM's arguments.py evaluated every 1000 steps", "no evaluation during training"):
        assert "".join(words.split()) in text, words
