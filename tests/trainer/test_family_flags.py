"""A flag the model family never reads is refused, not ignored; the flags it reads are checked for it.

- ``--seq-length``, ``--init-method-std``, ``--attention-dropout`` do nothing to a T5 (its lengths are
  ``--encoder-seq-length``/``--decoder-seq-length``, its positions relative): one line naming each;
  the t5 section's flags do nothing to a GPT. Defaults (a ``--load-hf`` directory's) never count.
- ``--max-position-embeddings`` is checked against the family's own lengths: seq_length for GPT and BERT,
  the encoder and decoder lengths for T5 (Megatron's check; CPM-Pretrain's run_t5.sh gives it).
- A tokenizer with more ids than a GPT's vocabulary (``--load-hf``'s, or ``--vocab-size``) is one line.
"""

import pytest

from trainer.cli.train import given_fields, main
from trainer.cli.train_args import build_parser, config_from_args
from trainer.models import model_spec, unused_fields
from trainer.parallel.dims import resolve_parallel_dims


def config_of(argv):
    return config_from_args(build_parser().parse_args(["--dataset", "p", *argv]))


def failing_line(argv, capsys) -> str:
    assert main(["--dataset", "p", "--device", "cpu", *argv]) != 0
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


@pytest.mark.parametrize(("argv", "expected"), [
    (["--model", "t5", "--seq-length", "64"], "--seq-length does not apply to model t5"),
    (["--model", "t5", "--init-method-std", "0.01", "--attention-dropout", "0"],
     "--init-method-std, --attention-dropout do not apply to model t5"),
    (["--model", "bert", "--multihead-attention-fusion"], "--fused-qkv applies to model gpt only, not bert"),
    (["--model", "t5", "--bert-no-binary-head"], "--bert-no-binary-head does not apply to model t5"),
    (["--enc-seq-length", "64"], "--encoder-seq-length does not apply to model gpt"),
    (["--mask-prob", "0.2", "--vocab-extra-ids", "0"], "--vocab-extra-ids, --mask-prob do not apply to model gpt"),
    (["--model", "bert", "--decoder-seq-length", "8"], "--decoder-seq-length does not apply to model bert"),
])
def test_a_flag_the_family_ignores_is_one_line_naming_it(argv, expected, capsys):
    assert failing_line(argv, capsys) == f"train: error: {expected}"


def test_the_value_does_not_matter_only_that_it_was_given(capsys):
    """Even the default's own value: the user asked for something the family cannot do."""
    assert "--seq-length does not apply" in failing_line(["--model", "t5", "--seq-length", "1024"], capsys)


def test_a_config_file_gives_flags_defaults_do_not(tmp_path, capsys):
    run = tmp_path / "run.yaml"
    run.write_text("seq_length: 64\nmodel: t5\n")
    assert failing_line(["--config", str(run)], capsys) == "train: error: --seq-length does not apply to model t5"
    assert given_fields(["--dataset", "p", "--lr", "0.1"]) == {"dataset", "lr"}


def test_bert_keeps_the_t5_sample_options_it_reads():
    unused = unused_fields("bert")
    assert "mask_prob" not in unused and "short_seq_prob" not in unused and "vocab_extra_ids" in unused


def rules_failing(config) -> list[str]:
    return [message for holds, message in model_spec(config.model.model).layout_rules(config, 1).rules if not holds]


def test_t5_checks_max_position_embeddings_against_its_own_lengths():
    t5 = ["--model", "t5", "--encoder-seq-length", "2048", "--decoder-seq-length", "16"]
    assert rules_failing(config_of(t5)) == []  # not given: nothing to cover
    assert rules_failing(config_of([*t5, "--max-position-embeddings", "2048"])) == []
    assert rules_failing(config_of([*t5, "--max-position-embeddings", "512"])) == [
        "max_position_embeddings (512) is smaller than encoder_seq_length (2048) or decoder_seq_length (16)"]
    # CPM-Pretrain's run_t5.sh: --enc-seq-length 1024 --dec-seq-length 384 --max-position-embeddings 1024
    cpm = config_of(["--model", "t5", "--enc-seq-length", "1024", "--dec-seq-length", "384",
                     "--max-position-embeddings", "1024"])
    assert rules_failing(cpm) == []


@pytest.mark.parametrize("model", ["gpt", "bert"])
def test_a_position_table_must_cover_seq_length(model):
    assert config_of(["--model", model, "--seq-length", "32"]).model.positions() == 32
    assert rules_failing(config_of(["--model", model, "--seq-length", "32", "--max-position-embeddings", "64"])) == []
    short = config_of(["--model", model, "--seq-length", "32", "--max-position-embeddings", "16"])
    assert rules_failing(short) == ["max_position_embeddings (16) is smaller than seq_length (32)"]
    with pytest.raises(ValueError, match="max_position_embeddings"):
        resolve_parallel_dims(short, 1, model_spec(short.model.model).layout_rules)


def test_a_gpt_tokenizer_larger_than_the_model_is_one_line(tiny_prefix, data_test, capsys):
    """The model (here --vocab-size, as --load-hf sets it) has 300 rows; GPT-2's tokenizer 50257 ids."""
    argv = ["--dataset", tiny_prefix, "--vocab-size", "300",
            "--vocab-file", str(data_test / "gpt2" / "gpt2-vocab.json"), "--merge-file", str(data_test / "gpt2" / "gpt2-merges.txt"), "--num-layers", "1", "--hidden-size", "16",
            "--num-attention-heads", "2", "--seq-length", "8", "--train-iters", "1", "--device", "cpu"]
    assert main(argv) != 0
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == [f"train: error: the tokenizer {data_test / 'gpt2' / 'gpt2-vocab.json'} has 50257 ids but the "
                     f"model's --vocab-size is 300: its ids do not fit the model"]
