"""T5/mT5 generation split over processes (gloo, CPU): greedy output equals transformers'
``generate(do_sample=False)`` token for token in one process, TP 2, PP 2, DP 2, TP 2 x PP 2 and PP 4;
text and id prompts in batches of unequal lengths, stopping at EOS; from a HF directory, an imported
checkpoint and a ``train --model t5`` checkpoint; seeded sampling draws the same tokens in every
tensor/pipeline layout; a layout the model does not divide into is refused before any process starts.

The oracles are tiny random T5ForConditionalGeneration (v1.0: ReLU, tied, 3 encoder + 1 decoder layers)
and MT5ForConditionalGeneration (gated GELU, untied head, 1 encoder + 3 decoder layers) made locally
(weights from our own seeded generator, `hf_testing.seed_weights`), with a ``spiece.model`` laid out like
T5's (pad 0, EOS 1, unk 2; 400 pieces and Hugging Face's 100 sentinels fill their 500 ids). The ids of
every layout equal transformers'; the texts equal the one-process run's. Their layer counts make every
pipeline split differ: PP 2 puts the first decoder layer on stage 1 beside an encoder layer (T5) or on stage 0 (mT5); PP 4 relays the encoder
through three stages to a decoder-only last stage (T5) or sends the encoder output from stage 1 to two
later decoder stages (mT5). Their EOS id is a token the greedy output reaches early, so prompts stop at
different steps inside one batch.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest
import torch
from hf_testing import seed_weights
from process_testing import run_jobs
from safetensors.torch import save_file

from preprocess.tokenizers import TokenizerConfig, build_tokenizer
from trainer.errors import TrainConfigError
from trainer.generation.generate import GenerateConfig
from trainer.models.dispatch import check_generation, generate
from trainer.generation.sampling import SamplingConfig
from trainer.checkpoint.hf_files import read_hf_config, tokenizer_config_for_directory, write_json
from trainer.models.t5.model import T5Shape
from trainer.models.t5.sharded import sharded_t5_layout

# The T5-style SentencePiece model's pieces, and Hugging Face's sentinels after them: the models' vocabulary.
SPM_PIECES = 400
VOCAB = SPM_PIECES + 100
DIMS = dict(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=48, num_heads=4, relative_attention_num_buckets=8,
            relative_attention_max_distance=20, dropout_rate=0.0, pad_token_id=0, decoder_start_token_id=0)
LAYERS = {"t5": (3, 1), "mt5": (1, 3)}
# Standard deviation of the fixtures' weights: logits far apart, varied greedy output.
WEIGHT_STD = 0.5
PAD = 0
NEW_TOKENS = 8
# The EOS id is the token greedy decoding of the first id prompt produces at this step.
EOS_STEP = 3
TEXTS = ["The manual page", "Hello world, this is a longer test sentence"]
PROMPT_IDS = [[17, 4, 250, 9], [8, 3, 61, 77, 120, 5, 33, 2, 90], [42], [300, 12, 7, 199, 6, 404]]
BATCH_SIZE = 3
SAMPLING = {"temperature": 1.5, "top_k": 20}


def _hf_model(variant: str, seed: int):
    from transformers import MT5Config, MT5ForConditionalGeneration, T5Config, T5ForConditionalGeneration

    encoder, decoder = LAYERS[variant]
    if variant == "t5":
        config = T5Config(feed_forward_proj="relu", num_layers=encoder, num_decoder_layers=decoder, **DIMS)
        return seed_weights(T5ForConditionalGeneration(config), seed, WEIGHT_STD).eval()
    config = MT5Config(feed_forward_proj="gated-gelu", num_layers=encoder, num_decoder_layers=decoder,
                       tie_word_embeddings=False, **DIMS)
    model = seed_weights(MT5ForConditionalGeneration(config), seed, WEIGHT_STD)
    # transformers 5 ties mT5's head on creation; real mT5 checkpoints hold their own lm_head.
    head_generator = torch.Generator().manual_seed(seed + 1)
    model.lm_head.weight = torch.nn.Parameter(torch.randn(VOCAB, DIMS["d_model"], generator=head_generator)
                                              * WEIGHT_STD)
    return model.eval()


def _save(model, variant: str, directory: Path) -> None:
    if variant == "t5":
        model.save_pretrained(directory)
    else:
        state = {name: tensor.detach().clone() for name, tensor in model.state_dict().items()
                 if not name.endswith("embed_tokens.weight")}
        directory.mkdir(parents=True)
        save_file(state, directory / "model.safetensors", metadata={"format": "pt"})
        write_json(directory / "config.json", model.config.to_dict())


def make_spiece(directory: Path, data_test: Path) -> Path:
    """A SentencePiece model laid out like T5's spiece.model (pad 0, EOS 1, unk 2, no BOS), of the sample texts."""
    import json

    import sentencepiece

    lines = [json.loads(line)["text"] for line in (data_test / "sample_en.jsonl").read_text().splitlines()]
    sentencepiece.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_prefix=str(directory / "spiece"),
                                             vocab_size=SPM_PIECES, pad_id=0, eos_id=1, unk_id=2, bos_id=-1,
                                             num_threads=1, minloglevel=2)
    return directory / "spiece.model"


def make_hf(directory: Path, variant: str, spiece: Path, seed: int = 0) -> Path:
    """A tiny random HF T5 or mT5 with ``spiece.model`` and an EOS id its greedy output reaches."""
    model = _hf_model(variant, seed)
    with torch.no_grad():
        ids = model.generate(torch.tensor([PROMPT_IDS[0]]), do_sample=False, max_new_tokens=EOS_STEP + 1,
                             min_new_tokens=EOS_STEP + 1, decoder_start_token_id=PAD, use_cache=False)[0, 1:]
    model.config.eos_token_id = model.generation_config.eos_token_id = int(ids[EOS_STEP])
    _save(model, variant, directory)
    shutil.copyfile(spiece, directory / "spiece.model")
    return directory


def hf_greedy(directory: Path, variant: str, prompts: list[list[int]]) -> list[list[int]]:
    """transformers' greedy continuation of each prompt on its own (no padding; stops right after EOS).
    Its decoder cache assumes as many decoder as encoder layers, so it runs without one."""
    from transformers import MT5ForConditionalGeneration, T5ForConditionalGeneration

    cls = T5ForConditionalGeneration if variant == "t5" else MT5ForConditionalGeneration
    model = cls.from_pretrained(directory).eval()
    with torch.no_grad():
        return [model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=NEW_TOKENS,
                               use_cache=False)[0, 1:].tolist() for ids in prompts]


def encoder_prompts(tokenizer, eos: int) -> list[list[int]]:
    """The encoder ids `generate` feeds: each text's pieces and EOS, then the id prompts."""
    return [tokenizer.encode(text) + [eos] for text in TEXTS] + PROMPT_IDS


def job_generate(load: str, tp: int, pp: int, sampling: dict | None = None,
                 tokenizer: dict | None = None) -> list[list]:
    """[ids, text] of every prompt generated in a tp x pp (x dp: the rest of the world) layout."""
    config = GenerateConfig(load=load, prompts=TEXTS, prompt_ids=PROMPT_IDS, max_new_tokens=NEW_TOKENS,
                            sampling=SamplingConfig(**sampling) if sampling else SamplingConfig(greedy=True),
                            tokenizer=TokenizerConfig(**tokenizer) if tokenizer else None,
                            batch_size=BATCH_SIZE, tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp)
    return [[c.ids, c.text] for c in generate(config)]


def _eos(directory: Path) -> int:
    return read_hf_config(directory)["eos_token_id"]


@pytest.fixture(scope="module")
def models(tmp_path_factory, data_test) -> dict:
    """Each variant's HF directory and checkpoint (imported: vocabulary padded to 512), transformers'
    greedy ids of every prompt, and our one-process [ids, text] of every prompt."""
    from trainer.models.t5.convert import import_hf_t5_checkpoint

    root = tmp_path_factory.mktemp("t5_generate")
    spiece = make_spiece(root, data_test)
    out = {}
    for variant in LAYERS:
        directory = make_hf(root / variant, variant, spiece)
        import_hf_t5_checkpoint(directory, root / f"{variant}-ckpt", make_vocab_size_divisible_by=128,
                                tensor_model_parallel_size=1)
        eos = _eos(directory)
        tokenizer = build_tokenizer(tokenizer_config_for_directory(directory))
        out[variant] = {"dir": str(directory), "ckpt": str(root / f"{variant}-ckpt"), "eos": eos,
                        "hf_ids": hf_greedy(directory, variant, encoder_prompts(tokenizer, eos)),
                        "one_process": job_generate(str(directory), 1, 1)}
    return out


@pytest.fixture(scope="module")
def trained(sentence_prefix, data_test, tmp_path_factory) -> dict:
    """A ``train --model t5`` checkpoint (2+2 layers, 2 steps) with its tokenizer options, transformers'
    greedy ids of its export, and our one-process [ids, text]."""
    from trainer_testing import t5_config

    from trainer.models.t5.convert import export_t5_checkpoint
    from trainer.train import train

    root = tmp_path_factory.mktemp("t5_trained")
    config = t5_config(sentence_prefix, data_test, str(root / "cache"), train_iters=2, save=str(root / "run"))
    train(config)
    export_t5_checkpoint(root / "run", 2, root / "hf")
    tokenizer = {"tokenizer_type": config.data.tokenizer_type, "tokenizer_model": config.data.tokenizer_model}
    prompts = encoder_prompts(build_tokenizer(TokenizerConfig(**tokenizer)), _eos(root / "hf"))
    return {"ckpt": str(root / "run"), "tokenizer": tokenizer, "hf_ids": hf_greedy(root / "hf", "t5", prompts),
            "one_process": job_generate(str(root / "run"), 1, 1, tokenizer=tokenizer)}


def one_process_sample(load: str) -> list[list]:
    return job_generate(load, 1, 1, SAMPLING)


# -- one process ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("variant", list(LAYERS))
def test_one_process_greedy_equals_transformers(models, variant):
    model = models[variant]
    assert [ids for ids, _ in model["one_process"]] == model["hf_ids"]
    assert all(isinstance(text, str) for _, text in model["one_process"])
    lengths = [len(ids) for ids in model["hf_ids"]]
    assert min(lengths) < NEW_TOKENS == max(lengths), "some prompts should stop at EOS, others run to the end"
    assert all(ids[-1] == model["eos"] for ids in model["hf_ids"] if len(ids) < NEW_TOKENS)
    # The imported checkpoint pads the vocabulary with zero rows: their logits are never chosen.
    assert job_generate(model["ckpt"], 1, 1) == model["one_process"]


def test_train_checkpoint_generates_what_its_export_does_in_transformers(trained):
    assert [ids for ids, _ in trained["one_process"]] == trained["hf_ids"]


def test_layout_rules_name_what_does_not_divide():
    shape = T5Shape(vocab_size=256, d_model=32, d_kv=8, d_ff=48, num_heads=4, num_encoder_layers=3,
                    num_decoder_layers=1)
    assert sharded_t5_layout(shape, 2, 2, 8).dp == 2
    cases = [(dataclasses.replace(shape, num_heads=6), 4, 1, 4, r"num_heads \(6\) is not divisible by "
                                                                  r"tensor_model_parallel_size \(4\)"),
             (dataclasses.replace(shape, d_ff=50), 4, 1, 4, r"d_ff \(50\) is not divisible by tensor_model_parallel"),
             (dataclasses.replace(shape, vocab_size=250), 4, 1, 4, r"the checkpoint's padded vocabulary \(250\)"),
             (shape, 1, 3, 3, r"encoder \+ decoder layers 3 \+ 1 \(4\) is not divisible by "
                              r"pipeline_model_parallel_size \(3\)"),
             (shape, 2, 2, 6, r"world size 6 is not divisible by tensor_model_parallel_size \(2\) x "
                              r"pipeline_model_parallel_size \(2\)")]
    for case_shape, tp, pp, world, message in cases:
        with pytest.raises(TrainConfigError, match=message):
            sharded_t5_layout(case_shape, tp, pp, world)


def test_generate_refuses_a_layout_before_any_process_starts(models):
    config = GenerateConfig(load=models["t5"]["ckpt"], prompt_ids=PROMPT_IDS, tensor_model_parallel_size=3)
    # The checkpoint's vocabulary is padded to 512 (a multiple of 128): 3 does not divide its 4 heads first.
    with pytest.raises(TrainConfigError, match=r"num_heads \(4\) is not divisible by tensor_model_parallel_size"):
        check_generation(config, 3)
    with pytest.raises(TrainConfigError, match="world size 1 is not divisible"):
        generate(dataclasses.replace(config, tensor_model_parallel_size=2))
    with pytest.raises(TrainConfigError, match=r"token ids in \[0, 500\)"):
        check_generation(dataclasses.replace(config, prompt_ids=[[VOCAB]]), 1)


# -- two processes --------------------------------------------------------------------------------------

TWO_PROCESS_JOBS = {
    "t5 dir tp2": ("t5", "dir", 2, 1), "t5 dir pp2": ("t5", "dir", 1, 2), "t5 dir dp2": ("t5", "dir", 1, 1),
    "mt5 dir tp2": ("mt5", "dir", 2, 1), "mt5 dir pp2": ("mt5", "dir", 1, 2),
    "mt5 ckpt pp2": ("mt5", "ckpt", 1, 2), "t5 ckpt tp2": ("t5", "ckpt", 2, 1),
}


@pytest.fixture(scope="module")
def two_process_runs(models, trained, tmp_path_factory) -> dict:
    jobs = [(job_generate, (models[variant][source], tp, pp), {}) for variant, source, tp, pp in
            TWO_PROCESS_JOBS.values()]
    jobs += [(job_generate, (trained["ckpt"], tp, pp), {"tokenizer": trained["tokenizer"]}) for tp, pp in
             ((2, 1), (1, 2))]
    jobs += [(job_generate, (models["t5"]["dir"], tp, pp, SAMPLING), {}) for tp, pp in ((2, 1), (1, 2))]
    results = run_jobs(2, jobs, tmp_path_factory.mktemp("two_process"))
    names = [*TWO_PROCESS_JOBS, "trained tp2", "trained pp2", "sampled tp2", "sampled pp2"]
    return dict(zip(names, results, strict=True))


@pytest.mark.timeout(600)
@pytest.mark.parametrize("name", list(TWO_PROCESS_JOBS))
def test_two_process_greedy_equals_transformers(two_process_runs, models, name):
    variant = TWO_PROCESS_JOBS[name][0]
    assert two_process_runs[name] == models[variant]["one_process"]


@pytest.mark.timeout(600)
def test_train_checkpoint_generates_split_over_processes(two_process_runs, trained):
    assert two_process_runs["trained tp2"] == trained["one_process"]
    assert two_process_runs["trained pp2"] == trained["one_process"]


@pytest.mark.timeout(600)
def test_sampling_draws_the_same_tokens_in_every_layout(two_process_runs, models):
    sampled = one_process_sample(models["t5"]["dir"])
    assert sampled != models["t5"]["one_process"], "sampling should differ from greedy"
    assert two_process_runs["sampled tp2"] == sampled
    assert two_process_runs["sampled pp2"] == sampled


# -- four processes -------------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.timeout(600)
def test_four_processes_greedy_equals_transformers(models, trained, tmp_path):
    layouts = [(variant, tp, pp) for variant in LAYERS for tp, pp in ((2, 2), (1, 4))]
    jobs = [(job_generate, (models[variant]["dir"], tp, pp), {}) for variant, tp, pp in layouts]
    jobs.append((job_generate, (trained["ckpt"], 2, 2), {"tokenizer": trained["tokenizer"]}))
    *generated, trained_tp2_pp2 = run_jobs(4, jobs, tmp_path)
    for (variant, tp, pp), result in zip(layouts, generated, strict=True):
        assert result == models[variant]["one_process"], f"{variant} tp {tp} pp {pp}"
    assert trained_tp2_pp2 == trained["one_process"]
