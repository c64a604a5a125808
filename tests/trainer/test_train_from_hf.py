"""``train`` starting from Hugging Face GPT-2 weights, and its checkpoints going back to transformers:

- ``train --load CONVERTED`` (a model-only `convert-checkpoint --from-hf` checkpoint) starts at step 0
  with a fresh optimiser, exactly where ``train --load-hf DIR`` starts;
- the first step's loss of either, in one process or under tensor parallelism, is transformers'
  loss on the same batch;
- ``train --load-hf DIR`` takes the shape and tokenizer files from DIR, and its checkpoints convert
  with ``convert-checkpoint --to-hf`` (no extra flags) into a directory `from_pretrained` loads.
"""

import dataclasses

import pytest
import torch
from hf_testing import DATA_TEST, hf_first_step_loss, hf_model, make_tiny_hf
from trainer_testing import run_in_processes, tiny_config

from trainer.cli.train import main as train_main
from trainer.cli.convert import main as convert_main
from trainer.models.gpt.convert import checkpoint_model, hf_train_defaults, read_checkpoint_state
from trainer.checkpoint.hf_files import read_hf_weights
from trainer.train import train

STEPS = 2
LOSS_TOLERANCE = 1e-5
GPT2_VOCAB = 50257
# The tiny HF vocabulary (300) padded to a multiple of 128 x tp.
PADDED_VOCAB, PADDED_VOCAB_TP2 = 384, 512


@pytest.fixture(scope="module")
def tiny_hf(tmp_path_factory):
    return make_tiny_hf(tmp_path_factory.mktemp("hf") / "tiny")


def run_config(tiny_prefix, cache_dir, hf_dir, **checkpoint):
    """The tiny data run with the HF directory's model shape, no dropout, STEPS steps."""
    config = tiny_config(tiny_prefix, cache_dir, train_iters=STEPS)
    shape = hf_train_defaults(hf_dir)["model"]
    model = dataclasses.replace(config.model, **shape, make_vocab_size_divisible_by=128)
    return dataclasses.replace(config, model=model,
                               checkpoint=dataclasses.replace(config.checkpoint, **checkpoint))




def test_converted_checkpoint_trains_from_step_zero_like_load_hf(tiny_hf, tiny_prefix, cache_dir, tmp_path):
    assert convert_main(["--from-hf", str(tiny_hf), "--to", str(tmp_path / "converted")]) == 0
    from_converted = train(run_config(tiny_prefix, cache_dir, tiny_hf, load=str(tmp_path / "converted"),
                                      save=str(tmp_path / "trained")))
    from_hf = train(run_config(tiny_prefix, cache_dir, tiny_hf, load_hf=str(tiny_hf)))

    assert from_converted.iteration == STEPS
    assert (tmp_path / "trained" / f"iter_{STEPS:07d}").is_dir()
    assert from_converted.losses == pytest.approx(from_hf.losses, abs=LOSS_TOLERANCE)
    hf_run = run_config(tiny_prefix, cache_dir, tiny_hf)
    expected = hf_first_step_loss(hf_run, hf_model(tiny_hf), PADDED_VOCAB, STEPS * hf_run.training.global_batch_size)
    assert from_hf.losses[0] == pytest.approx(expected, abs=LOSS_TOLERANCE)


@pytest.mark.timeout(400)
def test_load_hf_under_tensor_parallelism_starts_from_the_hf_weights(tiny_hf, tiny_prefix, cache_dir, workdir):
    config = run_config(tiny_prefix, cache_dir, tiny_hf, load_hf=str(tiny_hf))
    config = dataclasses.replace(config, parallelism=dataclasses.replace(config.parallelism,
                                                                         tensor_model_parallel_size=2))
    [result] = run_in_processes(2, [config], workdir)

    expected = hf_first_step_loss(config, hf_model(tiny_hf), PADDED_VOCAB_TP2, STEPS * config.training.global_batch_size)
    assert result["losses"][0] == pytest.approx(expected, abs=LOSS_TOLERANCE)


def test_cli_load_hf_takes_shape_and_tokenizer_and_exports_without_flags(tiny_prefix, cache_dir, tmp_path):
    hf_dir = make_tiny_hf(tmp_path / "gpt2-tiny", vocab_size=GPT2_VOCAB, with_gpt2_tokenizer=True)
    # No shape or tokenizer flags: those come from the directory.
    argv = ["--dataset", tiny_prefix, "--data-cache-path", cache_dir, "--split", "98,1,1", "--seq-length", "32",
            "--micro-batch-size", "2", "--global-batch-size", "8", "--train-iters", str(STEPS), "--eval-iters", "0",
            "--device", "cpu", "--metrics-file", str(tmp_path / "metrics.jsonl")]
    assert train_main([*argv, "--load-hf", str(hf_dir), "--save", str(tmp_path / "run")]) == 0

    root, iteration, info = checkpoint_model(tmp_path / "run")
    assert (iteration, info.vocab_size, info.eod_id) == (STEPS, GPT2_VOCAB, GPT2_VOCAB - 1)
    assert (root / "vocab.json").read_bytes() == (DATA_TEST / "gpt2" / "gpt2-vocab.json").read_bytes()
    assert convert_main(["--from", str(tmp_path / "run"), "--to-hf", str(tmp_path / "exported")]) == 0

    exported = hf_model(tmp_path / "exported")
    assert exported.config.n_head == 4 and exported.config.vocab_size == GPT2_VOCAB
    assert (tmp_path / "exported" / "merges.txt").is_file()
    trained = read_checkpoint_state(root, iteration, info.shape)
    assert torch.equal(exported.transformer.wte.weight, trained["tok_embeddings.weight"][:GPT2_VOCAB])
    started = read_hf_weights(hf_dir)
    assert not torch.equal(started["transformer.wte.weight"], trained["tok_embeddings.weight"][:GPT2_VOCAB])
