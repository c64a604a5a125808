"""``train --model bert``: masked-LM + sentence-order pre-training of a tiny BERT through the trainer's own loop.

The data is `preprocess-data --split-sentences` of the sample documents with the WordPiece test vocabulary
(BertWordPieceLowerCase). The command line trains and learns, bf16 runs, resuming is exact.
"""

from __future__ import annotations

import os

import pytest
from trainer_testing import argv_for

from trainer.cli.train import main
from trainer.config import (
    CheckpointConfig,
    DataConfig,
    LoggingConfig,
    ModelConfig,
    OptimizerConfig,
    PrecisionConfig,
    TrainConfig,
    TrainingConfig,
)
from trainer.errors import TrainConfigError
from trainer.models.bert.settings import BertConfig
from trainer.train import train

STEPS, HALF = 8, 4
# How far the held-out loss falls below the first step's in STEPS steps (measured: 0.96 nats with the binary
# head, 0.46 masked LM only).
LEARNED = 0.3


def bert_config(prefix: str, data_test, cache: str, *, train_iters: int = STEPS, save: str | None = None,
                load: str | None = None, bf16: bool = False, binary_head: bool = True) -> TrainConfig:
    """A 2-layer BERT (width 32), 32 positions, global batch 4, no dropout."""
    return TrainConfig(
        model=ModelConfig(model="bert", num_layers=2, hidden_size=32, num_attention_heads=4, ffn_hidden_size=64,
                          seq_length=32, make_vocab_size_divisible_by=64, hidden_dropout=0.0, attention_dropout=0.0),
        data=DataConfig(dataset=[prefix], split="98,2,0", data_cache_path=cache, tokenizer_type="BertWordPieceLowerCase",
                        vocab_file=str(data_test / "tokenizers" / "wordpiece-vocab.txt")),
        training=TrainingConfig(micro_batch_size=2, global_batch_size=4, train_iters=train_iters, device="cpu"),
        precision=PrecisionConfig(bf16=bf16),
        optimizer=OptimizerConfig(lr=1e-2, min_lr=1e-3, lr_warmup_iters=2, lr_decay_iters=2 * STEPS),
        checkpoint=CheckpointConfig(save=save, load=load),
        logging=LoggingConfig(log_interval=4, eval_iters=1, metrics_file=os.devnull),
        families={"bert": BertConfig(bert_no_binary_head=not binary_head)},
    )


def test_cli_trains_bert_learns_and_resumes_exactly(wordpiece_sentences, data_test, tmp_path):
    cache = str(tmp_path / "cache")
    reference = train(bert_config(wordpiece_sentences, data_test, cache))
    assert len(reference.losses) == STEPS
    assert reference.eval_losses.keys() == {"valid"}
    # Batches of 4 make single-step losses noisy (+-0.3): the held-out loss after training shows the learning.
    assert reference.eval_losses["valid"] < reference.losses[0] - LEARNED

    first = bert_config(wordpiece_sentences, data_test, cache, train_iters=HALF, save=str(tmp_path / "run"))
    assert main(argv_for(first)) == 0
    assert (tmp_path / "run" / f"iter_{HALF:07d}").is_dir()
    resumed = train(bert_config(wordpiece_sentences, data_test, cache, load=str(tmp_path / "run")))
    assert resumed.losses == reference.losses[HALF:]


def test_bf16_and_masked_lm_only_runs_learn(wordpiece_sentences, data_test, tmp_path):
    for config in (bert_config(wordpiece_sentences, data_test, str(tmp_path), bf16=True),
                   bert_config(wordpiece_sentences, data_test, str(tmp_path), binary_head=False)):
        result = train(config)
        assert result.eval_losses["valid"] < result.losses[0] - LEARNED


def test_bert_needs_a_wordpiece_vocabulary(wordpiece_sentences, data_test, tmp_path):
    config = bert_config(wordpiece_sentences, data_test, str(tmp_path))
    config.data.tokenizer_type, config.data.vocab_file = "NullTokenizer", None
    config.model.vocab_size = 1000
    with pytest.raises(TrainConfigError, match="model bert needs a WordPiece vocabulary"):
        train(config)


def test_an_incomplete_hugging_face_bert_refuses_in_one_line(data_test, tmp_path, capsys):
    from trainer.cli.convert import main as convert_main

    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text('{"model_type": "bert"}')
    assert convert_main(["--from-hf", str(hf), "--to", str(tmp_path / "ckpt")]) != 0
    error = capsys.readouterr().err
    assert "num_hidden_layers must be a positive integer" in error and len(error.strip().splitlines()) == 1
