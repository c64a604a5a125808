"""``train --load-hf DIR`` with a Hugging Face T5/mT5 directory (LiBai's "MT5 from mt5-base" workflow):

- DIR's shape (widths, layers, d_kv, MLP kind, head tying, relative position buckets) becomes the
  run's default, and the run starts from DIR's weights exactly where ``convert-checkpoint --from-hf``
  then ``train --load`` starts;
- tensor and pipeline parallel runs (the last stage's copy of a tied head included) follow the
  single-process run;
- a flag that contradicts DIR's shape is one clear error; the checkpoints export back to transformers.
"""

import dataclasses
from pathlib import Path

import pytest
import torch
from hf_testing import seed_weights
from trainer_testing import LOSS_RTOL, argv_for, run_in_processes, t5_config

from trainer.cli.train import main as train_main
from trainer.config import ParallelismConfig
from trainer.cli.convert import main as convert_main
from trainer.models.t5.config import resolve_t5_special_ids
from trainer.models.t5.convert import read_t5_model_config, t5_train_defaults
from trainer.models.t5.settings import t5_settings
from trainer.train import train

STEPS = 3
# Standard deviation of the fixture's matrices (our own seeded draw, `hf_testing.seed_weights`).
WEIGHT_STD = 0.5
# Not T5's 32/128: the run must take the buckets from the directory.
BUCKETS, MAX_DISTANCE = 8, 20
# The HF vocabulary is the tokenizer's rounded up to this, so tp 1 and tp 2 pad it alike (64 x tp).
VOCAB_MULTIPLE = 128


@pytest.fixture(scope="module")
def hf_t5(sentence_prefix, data_test, tmp_path_factory) -> Path:
    """A tiny random T5 v1.0 (tied, scaled head) over the run's tokenizer, made locally."""
    from transformers import T5Config, T5ForConditionalGeneration

    tokenizer_vocab = resolve_t5_special_ids(t5_config(sentence_prefix, data_test, "").data, 100).vocab_size
    vocab = -(-tokenizer_vocab // VOCAB_MULTIPLE) * VOCAB_MULTIPLE
    config = T5Config(vocab_size=vocab, d_model=32, d_kv=8, d_ff=48, num_heads=4, num_layers=2, num_decoder_layers=2,
                      feed_forward_proj="relu", relative_attention_num_buckets=BUCKETS,
                      relative_attention_max_distance=MAX_DISTANCE, dropout_rate=0.0)
    directory = tmp_path_factory.mktemp("hf_t5") / "tiny-t5"
    seed_weights(T5ForConditionalGeneration(config), seed=0, std=WEIGHT_STD).save_pretrained(directory)
    return directory


def run_config(prefix, data_test, cache, hf_dir, **parallelism):
    """The T5 test run with DIR's shape (what the CLI's defaults give), STEPS steps, starting from DIR."""
    config = t5_config(prefix, data_test, cache, train_iters=STEPS, **parallelism)
    defaults = t5_train_defaults(hf_dir)
    return dataclasses.replace(
        config, model=dataclasses.replace(config.model, **defaults["model"]),
        families={**config.families, "t5": dataclasses.replace(t5_settings(config), **defaults["t5"])},
        checkpoint=dataclasses.replace(config.checkpoint, load_hf=str(hf_dir)))


def test_the_shape_defaults_come_from_the_directory(hf_t5):
    defaults = t5_train_defaults(hf_t5)
    assert defaults["model"]["model"] == "t5" and defaults["model"]["hidden_size"] == 32
    assert (defaults["model"]["kv_channels"], defaults["model"]["untie_embeddings_and_output_weights"]) == (8, False)
    assert defaults["t5"] == {"decoder_num_layers": 2, "feed_forward_proj": "relu", "scale_decoder_outputs": True,
                              "relative_attention_num_buckets": BUCKETS,
                              "relative_attention_max_distance": MAX_DISTANCE}


def test_load_hf_starts_where_the_converted_checkpoint_starts(sentence_prefix, data_test, hf_t5, tmp_path):
    cache = str(tmp_path / "cache")
    from_hf = train(run_config(sentence_prefix, data_test, cache, hf_t5))
    assert convert_main(["--from-hf", str(hf_t5), "--to", str(tmp_path / "converted"),
                         "--make-vocab-size-divisible-by", "64"]) == 0
    converted = run_config(sentence_prefix, data_test, cache, hf_t5)
    converted = dataclasses.replace(converted, checkpoint=dataclasses.replace(
        converted.checkpoint, load_hf=None, load=str(tmp_path / "converted")))
    from_converted = train(converted)
    random_start = run_config(sentence_prefix, data_test, cache, hf_t5)
    random_start = dataclasses.replace(random_start, checkpoint=dataclasses.replace(random_start.checkpoint,
                                                                                    load_hf=None))

    assert from_hf.losses == pytest.approx(from_converted.losses, abs=1e-6)
    assert abs(from_hf.losses[0] - train(random_start).losses[0]) > 0.1


@pytest.mark.timeout(600)
def test_parallel_layouts_load_the_same_weights(sentence_prefix, data_test, hf_t5, tmp_path, workdir):
    cache = str(tmp_path / "cache")
    reference = train(run_config(sentence_prefix, data_test, cache, hf_t5)).losses
    layouts = {"tp2": {"tensor_model_parallel_size": 2}, "pp2": {"pipeline_model_parallel_size": 2}}
    configs = [run_config(sentence_prefix, data_test, cache, hf_t5, **layout) for layout in layouts.values()]
    for name, result in zip(layouts, run_in_processes(2, configs, workdir)):
        assert result["losses"] == pytest.approx(reference, rel=LOSS_RTOL, abs=0), name


def test_cli_takes_the_shape_refuses_a_contradiction_and_exports(sentence_prefix, data_test, hf_t5, tmp_path,
                                                                 capsys):
    config = t5_config(sentence_prefix, data_test, str(tmp_path / "cache"), train_iters=STEPS,
                       save=str(tmp_path / "run"))
    # Only data, batch and tokenizer flags: no --model t5 and no shape flags.
    config = dataclasses.replace(config, model=dataclasses.replace(type(config.model)(), hidden_dropout=0.0,
                                                                   make_vocab_size_divisible_by=64),
                                 parallelism=ParallelismConfig())
    argv = [*argv_for(config), "--load-hf", str(hf_t5)]
    assert train_main([*argv, "--hidden-size", "64"]) == 1
    assert "the model has d_model 32 but the run asks for 64" in capsys.readouterr().err

    assert train_main(argv) == 0
    info = read_t5_model_config(tmp_path / "run")
    assert (info["shape"].d_model, info["shape"].relative_attention_num_buckets) == (32, BUCKETS)
    assert convert_main(["--from", str(tmp_path / "run"), "--to-hf", str(tmp_path / "exported")]) == 0
    from transformers import T5ForConditionalGeneration

    exported = T5ForConditionalGeneration.from_pretrained(tmp_path / "exported")
    assert exported.config.relative_attention_num_buckets == BUCKETS
    started = T5ForConditionalGeneration.from_pretrained(hf_t5)
    assert exported.shared.weight.shape == started.shared.weight.shape
    assert not torch.equal(exported.shared.weight, started.shared.weight)
