"""Generation and logits of Hugging Face Llama-class models (issue 30, points 3, 4 and 5).

- ``generate`` from a HF directory of every architecture (grouped KV cache, rope positions continuing through
  the cache, a left-padded batch) gives transformers' greedy tokens, token for token, and the checkpoint
  ``convert-checkpoint --from-hf`` made gives the same;
- split over 2 gloo processes: tensor parallel generation (q heads and kv groups split over tp), pipeline
  parallel, data parallel and (Mixtral) expert parallel generation give the same tokens, and at TP 2 over a vocabulary padded to 384 rows the logits are
  transformers' within 1e-5 of the largest logit;
- the ``generate`` CLI reads a text prompt with ``--tokenizer-type Llama2Tokenizer --tokenizer-model`` (BOS
  first, as Megatron's) and stops at the model's EOS.
"""

from __future__ import annotations

import json

import pytest
import sentencepiece
import torch
from hf_llama_testing import SP_BPE, VARIANTS, hf_llama, make_tiny_llama, max_logit_tolerance
from hf_testing import TINY_VOCAB, hf_greedy, job_generate, prompt_batch
from process_testing import run_jobs

from trainer.cli.convert import main as convert
from trainer.cli.generate import main as generate_cli

NEW_TOKENS = 10
RELATIVE_TOLERANCE = 1e-5
# Two processes: tp 2 for the variants whose kv groups divide by 2, pp 2 for one.
TP2_VARIANTS = ("llama3", "qwen2", "qwen3", "mixtral")
PP2_VARIANT = "llama2"
LOGITS_SEQUENCE = 20


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict:
    """Every variant's HF directory, and its checkpoint with the vocabulary padded for tp 2 (384 rows)."""
    workdir = tmp_path_factory.mktemp("llama_generate")
    out = {}
    for variant in VARIANTS:
        source = make_tiny_llama(workdir / variant, variant)
        checkpoint = workdir / f"{variant}_ckpt"
        assert convert(["--from-hf", str(source), "--to", str(checkpoint), "--make-vocab-size-divisible-by", "64",
                        "--tensor-model-parallel-size", "2"]) == 0
        out[variant] = (source, checkpoint)
    return out


@pytest.fixture(scope="module")
def expected(models) -> dict:
    return {variant: hf_greedy(hf_llama(source), prompt_batch(), NEW_TOKENS) for variant, (source, _) in models.items()}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_greedy_equals_transformers_from_directory_and_checkpoint(models, expected, variant):
    source, checkpoint = models[variant]
    assert job_generate(1, 1, str(source), prompt_batch(), NEW_TOKENS) == expected[variant]
    assert job_generate(1, 1, str(checkpoint), prompt_batch(), NEW_TOKENS) == expected[variant]


def job_generate_ep(load: str, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """Greedy generation with each MoE layer's experts split over the 2 processes (each its own prompts)."""
    from trainer.generation.generate import GenerateConfig
    from trainer.generation.sampling import SamplingConfig
    from trainer.models.dispatch import generate

    config = GenerateConfig(load=load, prompt_ids=prompts, max_new_tokens=max_new_tokens,
                            sampling=SamplingConfig(greedy=True), expert_model_parallel_size=2, batch_size=2)
    return [c.ids for c in generate(config)]


def job_logits(tp: int, load: str, tokens: list[list[int]]) -> list:
    """Full logits [batch, seq, vocab] of ``tokens`` from this rank's part of a tp-sharded model."""
    import torch.distributed as dist

    from trainer.models.gpt.generate import resolve_gpt_source

    source = resolve_gpt_source(load, tp)
    layout = source.layout(tp, 1, dist.get_world_size())
    model = source.open_sharded(layout, "cpu", torch.device("cpu"), verify=True)
    batch = torch.tensor(tokens)
    with torch.no_grad():
        # The blocks, then the final norm and the vocabulary-parallel head (what `score` applies).
        logits = model.logits(model._hidden_states(batch, torch.arange(batch.shape[1]).expand_as(batch), None))
    logits = logits.full_tensor() if hasattr(logits, "full_tensor") else logits
    return logits[..., :source.vocab_size].tolist()


@pytest.fixture(scope="module")
def two_process_run(models, tmp_path_factory) -> dict:
    workdir = tmp_path_factory.mktemp("llama_two_process")
    tokens = prompt_batch((LOGITS_SEQUENCE,) * 2, seed=3)
    jobs = [(job_generate, (2, 1, str(models[v][0]), prompt_batch(), NEW_TOKENS), {}) for v in TP2_VARIANTS]
    jobs.append((job_generate, (1, 2, str(models[PP2_VARIANT][1]), prompt_batch(), NEW_TOKENS), {}))
    jobs += [(job_logits, (2, str(models[v][1]), tokens), {}) for v in TP2_VARIANTS]
    jobs.append((job_generate, (1, 1, str(models["llama3"][0]), prompt_batch(), NEW_TOKENS), {}))  # dp 2
    jobs.append((job_generate_ep, (str(models["mixtral"][1]), prompt_batch(), NEW_TOKENS), {}))
    results = run_jobs(2, jobs, workdir)
    count = len(TP2_VARIANTS)
    return {"tp2": dict(zip(TP2_VARIANTS, results[:count])), "pp2": results[count],
            "logits": dict(zip(TP2_VARIANTS, results[count + 1:2 * count + 1])), "dp2": results[-2],
            "ep2": results[-1], "tokens": tokens}


@pytest.mark.parametrize("variant", TP2_VARIANTS)
def test_tensor_parallel_generation_and_padded_logits(models, expected, two_process_run, variant):
    assert two_process_run["tp2"][variant] == expected[variant]
    with torch.no_grad():
        want = hf_llama(models[variant][0])(torch.tensor(two_process_run["tokens"])).logits
    got = torch.tensor(two_process_run["logits"][variant])
    assert torch.allclose(got, want, rtol=0, atol=max_logit_tolerance(want, RELATIVE_TOLERANCE))


def test_pipeline_data_and_expert_parallel_generation(expected, two_process_run):
    assert two_process_run["pp2"] == expected[PP2_VARIANT]
    assert two_process_run["dp2"] == expected["llama3"]
    assert two_process_run["ep2"] == expected["mixtral"]


def test_cli_generates_from_a_text_prompt_with_the_llama2_tokenizer(tmp_path, capsys):
    vocab = sentencepiece.SentencePieceProcessor(model_file=SP_BPE)
    source = make_tiny_llama(tmp_path / "llama", "llama3", vocab_size=vocab.get_piece_size(),
                             bos_token_id=vocab.bos_id(), eos_token_id=vocab.eos_id())
    prompt = "Hello world"
    ids = [vocab.bos_id(), *vocab.encode(prompt)]  # Megatron's Llama2Tokenizer
    want = hf_greedy(hf_llama(source), [ids], NEW_TOKENS)[0]
    capsys.readouterr()
    assert generate_cli(["--load", str(source), "--prompt", prompt, "--greedy", "--max-new-tokens", str(NEW_TOKENS),
                         "--json", "--tokenizer-type", "Llama2Tokenizer", "--tokenizer-model", SP_BPE]) == 0
    record = json.loads(capsys.readouterr().out)
    cut = want.index(vocab.eos_id()) + 1 if vocab.eos_id() in want else len(want)
    assert record["ids"] == want[:cut]
    assert record["text"] == vocab.decode([i for i in want[:cut] if i != vocab.eos_id()])


def test_vocabulary_is_the_configs(models):
    # The padded rows never reach generation: ids past the real vocabulary are refused.
    source, checkpoint = models["qwen2"]
    with pytest.raises(Exception, match=rf"\[0, {TINY_VOCAB}\)"):
        job_generate(1, 1, str(checkpoint), [[TINY_VOCAB]], 1)
