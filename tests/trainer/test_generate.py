"""`generate` in one process: transformers' greedy tokens, KV cache = full recompute, sampling rules,
EOD stopping, and the CLI's text and JSON output."""

import json
import shutil

import pytest
import torch
from hf_testing import hf_greedy, hf_model, make_tiny_hf, prompt_batch

from trainer.generation.generate import GenerateConfig
from trainer.models.dispatch import generate
from trainer.cli.generate import main
from trainer.generation.sampling import SamplingConfig, filter_logits

NEW_TOKENS = 12


@pytest.fixture(scope="module")
def tiny_hf(tmp_path_factory):
    return make_tiny_hf(tmp_path_factory.mktemp("hf") / "tiny")


@pytest.fixture(scope="module")
def tokenizer_hf(tmp_path_factory):
    return make_tiny_hf(tmp_path_factory.mktemp("hf") / "with_tokenizer", vocab_size=50257, with_gpt2_tokenizer=True)


def run(load, prompts, **options) -> list:
    return generate(GenerateConfig(load=str(load), prompt_ids=prompts, **options))


def test_greedy_equals_transformers_for_a_left_padded_batch(tiny_hf):
    prompts = prompt_batch()
    ours = run(tiny_hf, prompts, max_new_tokens=NEW_TOKENS, sampling=SamplingConfig(greedy=True))
    assert [c.ids for c in ours] == hf_greedy(hf_model(tiny_hf), prompts, NEW_TOKENS)


def test_batching_does_not_change_greedy_output(tiny_hf):
    prompts = prompt_batch()
    one_by_one = run(tiny_hf, prompts, max_new_tokens=NEW_TOKENS, sampling=SamplingConfig(greedy=True), batch_size=1)
    together = run(tiny_hf, prompts, max_new_tokens=NEW_TOKENS, sampling=SamplingConfig(greedy=True))
    assert [c.ids for c in one_by_one] == [c.ids for c in together]


def test_checkpoint_and_hf_directory_generate_the_same(tiny_hf, tmp_path):
    from trainer.models.gpt.convert import import_hf_checkpoint

    import_hf_checkpoint(tiny_hf, tmp_path / "ckpt")
    prompts = prompt_batch((5, 2))
    options = {"max_new_tokens": NEW_TOKENS, "sampling": SamplingConfig(temperature=0.8, top_k=20), "seed": 7}
    assert [c.ids for c in run(tmp_path / "ckpt", prompts, **options)] == [c.ids for c in run(tiny_hf, prompts,
                                                                                              **options)]


def test_generation_stops_at_eod(tiny_hf, tmp_path):
    prompt = prompt_batch((4,))
    greedy = run(tiny_hf, prompt, max_new_tokens=NEW_TOKENS, sampling=SamplingConfig(greedy=True))[0].ids
    # The same model whose EOS is the third token it generates: the continuation must end right there.
    stopping = tmp_path / "stopping"
    shutil.copytree(tiny_hf, stopping)
    config = json.loads((stopping / "config.json").read_text())
    config["eos_token_id"] = greedy[2]
    (stopping / "config.json").write_text(json.dumps(config))
    stopped = run(stopping, prompt, max_new_tokens=NEW_TOKENS, sampling=SamplingConfig(greedy=True))[0].ids
    assert stopped == greedy[:greedy.index(greedy[2]) + 1]


def test_sampling_is_seeded_and_filters_follow_transformers():
    logits = torch.tensor([[1.0, 3.0, 2.0, 0.5]])
    assert torch.isinf(filter_logits(logits, SamplingConfig(top_k=2))).tolist() == [[True, False, False, True]]
    # probabilities ~ [0.08, 0.60, 0.22, 0.05]: top_p 0.7 keeps the two most likely tokens
    assert torch.isinf(filter_logits(logits, SamplingConfig(top_p=0.7))).tolist() == [[True, False, False, True]]
    from transformers.generation.logits_process import TopKLogitsWarper, TopPLogitsWarper

    scores = torch.randn(3, 50, generator=torch.Generator().manual_seed(0))
    for k, p in ((5, 1.0), (0, 0.8), (7, 0.5)):
        want = scores.clone()
        if k:
            want = TopKLogitsWarper(k)(None, want)
        if p < 1:
            want = TopPLogitsWarper(p)(None, want)
        assert torch.equal(torch.isinf(filter_logits(scores, SamplingConfig(top_k=k, top_p=p))), torch.isinf(want))


def test_same_seed_same_sample_and_top_k_one_is_greedy(tiny_hf):
    prompts = prompt_batch((5, 3))
    first = run(tiny_hf, prompts, max_new_tokens=NEW_TOKENS, seed=11)
    again = run(tiny_hf, prompts, max_new_tokens=NEW_TOKENS, seed=11)
    assert [c.ids for c in first] == [c.ids for c in again]
    greedy = run(tiny_hf, prompts, max_new_tokens=NEW_TOKENS, sampling=SamplingConfig(greedy=True))
    top1 = run(tiny_hf, prompts, max_new_tokens=NEW_TOKENS, sampling=SamplingConfig(top_k=1), seed=5)
    assert [c.ids for c in top1] == [c.ids for c in greedy]


def test_cli_prints_text_and_json_with_the_stored_tokenizer(tokenizer_hf, tmp_path, capsys):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("Hello, my name is\n\nThe quick brown fox\n")
    argv = ["--load", str(tokenizer_hf), "--prompt-file", str(prompts), "--greedy", "--max-new-tokens", "6"]
    assert main([*argv, "--json"]) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["prompt"] for r in records] == ["Hello, my name is", "The quick brown fox"]
    assert all(len(r["ids"]) == 6 and isinstance(r["text"], str) for r in records)
    assert main(argv) == 0
    assert capsys.readouterr().out.splitlines() == [line for n, r in enumerate(records, start=1) for line in (
        f"--- prompt {n} ---", r["prompt"], f"--- continuation {n} ---", *r["text"].split("\n"))]
    assert main(["--load", str(tokenizer_hf), "--prompt-ids", " ".join(map(str, records[0]["ids"][:2])), "--json",
                 "--greedy", "--max-new-tokens", "3"]) == 0
    assert json.loads(capsys.readouterr().out)["prompt"] == records[0]["ids"][:2]


@pytest.mark.parametrize("argv, message", [
    (["--prompt", "hi"], "text prompts need a tokenizer"),
    (["--prompt-ids", "1 x"], "expected integers"),
    (["--prompt-ids", "1 300"], "prompt token ids must be in [0, 300)"),
    (["--prompt-ids", "1", "--max-new-tokens", "200"], "exceeds the model's 128 positions"),
    (["--prompt-ids", "1", "--top-p", "0"], "--top-p must be in (0, 1]"),
    (["--prompt", "hi", "--vocab-file", "v.json"], "--vocab-file needs --tokenizer-type"),
    (["--prompt-ids", "1", "--tensor-model-parallel-size", "3", "--nproc-per-node", "3"],
     "num_attention_heads (4) is not divisible by --tensor-model-parallel-size (3)"),
])
def test_cli_errors_are_one_line(tiny_hf, capsys, argv, message):
    assert main(["--load", str(tiny_hf), *argv]) != 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err


def test_kv_cache_decoding_gives_the_full_forward_logits_of_each_row():
    from trainer.models.gpt.generate import left_pad
    from trainer.generation.kv_cache import KVCache
    from trainer.models.gpt.model import GPT, GPTShape

    torch.manual_seed(0)
    model = GPT(GPTShape(num_layers=2, hidden_size=32, num_attention_heads=4, ffn_hidden_size=64,
                         max_position_embeddings=64, padded_vocab_size=50, init_method_std=0.5)).eval()
    rows = prompt_batch((2, 6, 4), vocab_size=50)
    continuation = prompt_batch((5, 5, 5), vocab_size=50, seed=9)
    tokens, mask, positions = left_pad(rows, torch.device("cpu"))
    cache = KVCache(mask, max_length=tokens.shape[1] + 5)
    with torch.no_grad():
        stepped = [model(tokens, positions, kv_cache=cache.step(tokens.shape[1]))[:, -1]]
        for step in range(5):
            new = torch.tensor([c[step] for c in continuation])[:, None]
            stepped.append(model(new, mask.sum(1, keepdim=True) + step, kv_cache=cache.step(1))[:, -1])
        for row, (prompt, more) in enumerate(zip(rows, continuation)):
            full = torch.tensor([prompt + more])
            want = model(full, torch.arange(full.shape[1])[None])[0, len(prompt) - 1:]
            got = torch.stack([s[row] for s in stepped])
            assert torch.allclose(got, want, rtol=0, atol=1e-5), f"row {row}"
