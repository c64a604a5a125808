"""``train --load-hf`` from Hugging Face Llama-class directories, and back (issue 30, point 3).

- the run takes the model's shape and Llama-class options from the directory (`hf_train_defaults`: Megatron's
  flags, Mixtral's experts), and its first step's loss is transformers' loss on the same batch;
- the run's checkpoint exports with ``convert-checkpoint --to-hf`` (no extra flags) as the architecture it
  came from, which transformers loads with the trained weights;
- a directory whose rope settings Megatron's flags cannot express is refused in one line naming the field.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from hf_llama_testing import VARIANTS, hf_llama, make_tiny_llama
from hf_testing import hf_first_step_loss
from trainer_testing import tiny_config

from trainer.checkpoint.hf_files import read_hf_weights
from trainer.cli.convert import main as convert_main
from trainer.errors import HFConversionError
from trainer.models.gpt.convert import checkpoint_model, hf_train_defaults, read_checkpoint_state
from trainer.train import train

STEPS = 2
LOSS_TOLERANCE = 1e-5
TRAINED = ("llama3", "qwen2", "qwen3", "mixtral")
# Llama 3.1's own rope_scaling: the constants Megatron's --use-rope-scaling hard-codes (train builds from flags).
LLAMA31_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192}


def run_config(tiny_prefix, cache_dir, hf_dir, save):
    """The tiny data run with the directory's defaults (model and experts), no dropout, STEPS steps."""
    config = tiny_config(tiny_prefix, cache_dir, train_iters=STEPS, save=str(save))
    defaults = hf_train_defaults(hf_dir)
    model = dataclasses.replace(config.model, **defaults["model"], make_vocab_size_divisible_by=128)
    moe = dataclasses.replace(config.moe, **defaults.get("moe", {}))
    return dataclasses.replace(config, model=model, moe=moe,
                               checkpoint=dataclasses.replace(config.checkpoint, load_hf=str(hf_dir)))




@pytest.mark.parametrize("variant", TRAINED)
def test_load_hf_trains_from_the_hf_model_and_exports_as_it(tiny_prefix, cache_dir, tmp_path, variant):
    overrides = {"rope_scaling": LLAMA31_ROPE} if variant == "llama3" else {}
    hf_dir = make_tiny_llama(tmp_path / "hf", variant, **overrides)
    config = run_config(tiny_prefix, cache_dir, hf_dir, tmp_path / "run")
    # No router noise: the first step's loss is then transformers' (Mixtral's aux loss is not in its logits).
    config = dataclasses.replace(config, moe=dataclasses.replace(config.moe, moe_aux_loss_coeff=0.0))
    result = train(config)
    assert result.losses[0] == pytest.approx(hf_first_step_loss(config, hf_llama(hf_dir), 384, STEPS * config.training.global_batch_size), abs=LOSS_TOLERANCE)

    assert convert_main(["--from", str(tmp_path / "run"), "--to-hf", str(tmp_path / "exported")]) == 0
    exported = json.loads((tmp_path / "exported" / "config.json").read_text())
    assert exported["architectures"] == [VARIANTS[variant][1]]
    root, iteration, info = checkpoint_model(tmp_path / "run")
    trained = read_checkpoint_state(root, iteration, info.shape)
    written = read_hf_weights(tmp_path / "exported")
    assert written.keys() == read_hf_weights(hf_dir).keys()
    assert torch.equal(written["model.embed_tokens.weight"], trained["tok_embeddings.weight"][:300])
    assert not torch.equal(written["model.embed_tokens.weight"], read_hf_weights(hf_dir)["model.embed_tokens.weight"])
    hf_llama(tmp_path / "exported")  # loads without missing or unexpected weights


@pytest.mark.parametrize("rope, named", [
    ({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 2.0, "high_freq_factor": 4.0,
      "original_max_position_embeddings": 64}, "low_freq_factor=2.0"),
    ({"rope_type": "linear", "factor": 2.5}, "factor=2.5"),
])
def test_rope_the_flags_cannot_express_is_refused(tmp_path, rope, named):
    hf_dir = make_tiny_llama(tmp_path / "hf", "llama2")
    config = json.loads((hf_dir / "config.json").read_text())
    config["rope_parameters"] = {**rope, "rope_theta": 10000.0}
    (hf_dir / "config.json").write_text(json.dumps(config))
    with pytest.raises(HFConversionError, match=named):
        hf_train_defaults(hf_dir)


def test_cli_llama_flags_and_llama2_tokenizer_train_and_export(tiny_prefix, cache_dir, tmp_path):
    import transformers

    from hf_llama_testing import SP_BPE
    from preprocess.tokenizers import TokenizerConfig, build_tokenizer
    from trainer.cli.train import main as train_main

    argv = ["--dataset", tiny_prefix, "--data-cache-path", cache_dir, "--split", "98,1,1", "--seq-length", "32",
            "--micro-batch-size", "2", "--global-batch-size", "4", "--train-iters", "1", "--eval-iters", "0",
            "--device", "cpu", "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
            "--tokenizer-type", "Llama2Tokenizer", "--tokenizer-model", SP_BPE, "--normalization", "RMSNorm",
            "--swiglu", "--position-embedding-type", "rope", "--rotary-base", "500000", "--use-rope-scaling",
            "--group-query-attention", "--num-query-groups", "2", "--disable-bias-linear",
            "--untie-embeddings-and-output-weights", "--save", str(tmp_path / "run")]
    assert train_main(argv) == 0
    assert (tmp_path / "run" / "tokenizer.model").read_bytes() == open(SP_BPE, "rb").read()
    assert convert_main(["--from", str(tmp_path / "run"), "--to-hf", str(tmp_path / "exported")]) == 0
    config = json.loads((tmp_path / "exported" / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["num_key_value_heads"] == 2
    assert config["rope_parameters"]["rope_type"] == "llama3"
    hf_llama(tmp_path / "exported")
    ours = build_tokenizer(TokenizerConfig(tokenizer_type="Llama2Tokenizer", tokenizer_model=SP_BPE))
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path / "exported")
    assert theirs("Hello world").input_ids == ours.encode("Hello world")
