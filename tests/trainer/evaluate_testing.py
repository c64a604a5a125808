"""Shared pieces of the evaluation tests: transformers' own scores of our rows (the reference), the tiny
GPT-2 with GPT-2's tokenizer they run on (the `tiny_hf` and `checkpoint` fixtures: import them into a test
module), and the jobs the multi-process tests run."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hf_testing import DATA_TEST, make_tiny_hf

EVAL_DATA = DATA_TEST / "evaluate"
LAMBADA_SAMPLE = EVAL_DATA / "lambada_sample.jsonl"
WIKI_SAMPLE = EVAL_DATA / "wiki_sample.test.tokens"
# The brief's bound on perplexities: ours against transformers', relative.
PPL_RTOL = 1e-5
# Small windows, so that the sample text spans many of them (the tiny model has 128 positions).
SEQ_LENGTH = 48
OVERLAP = 16


def make_eval_model(directory: Path) -> Path:
    """The tiny random GPT-2 (2 layers, hidden 64) with GPT-2's real tokenizer files (vocabulary 50257)."""
    return make_tiny_hf(directory, vocab_size=50257, with_gpt2_tokenizer=True)


@pytest.fixture(scope="module")
def tiny_hf(tmp_path_factory) -> Path:
    """`make_eval_model` in the test session's folder (one per test module)."""
    return make_eval_model(tmp_path_factory.mktemp("eval_hf") / "tiny")


@pytest.fixture(scope="module")
def checkpoint(tiny_hf, tmp_path_factory) -> Path:
    """The tiny GPT-2 imported with ``convert-checkpoint --from-hf`` (vocabulary padded to 50304 rows)."""
    from trainer.cli.convert import main as convert

    root = tmp_path_factory.mktemp("eval_ckpt") / "ckpt"
    assert convert(["--from-hf", str(tiny_hf), "--to", str(root)]) == 0
    return root


def hf_tokenizer(directory: Path):
    from transformers import GPT2TokenizerFast

    # from_pretrained reads vocab.json and merges.txt alike in transformers 4 and 5 (the constructors differ).
    return GPT2TokenizerFast.from_pretrained(str(directory))


@torch.no_grad()
def hf_row_scores(model, rows) -> list[tuple[float, bool]]:
    """transformers' (summed log-probability, all greedy) of each `ScoreRow`'s scored targets, one row at a time
    (no padding involved)."""
    out = []
    for row in rows:
        ids = torch.as_tensor(row.ids, dtype=torch.int64)
        logits = model(ids[None, :-1]).logits[0].float()
        targets = ids[1:]
        log_probs = torch.log_softmax(logits, dim=-1).gather(-1, targets[:, None])[:, 0]
        hits = logits.argmax(dim=-1) == targets
        out.append((float(log_probs[row.first:row.last].double().sum()), bool(hits[row.first:row.last].all())))
    return out


def job_evaluate(tp: int, pp: int, load: str, task: str, data: str, options: dict) -> dict:
    """`evaluate` in a tp x pp layout (dp: the rest of the world)."""
    from trainer.evaluation.evaluate import EvaluateConfig, evaluate
    from trainer.evaluation.scoring import EvalModelConfig
    from trainer.models.dispatch import resolve_scoring_source

    model = EvalModelConfig(load=load, tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
                            batch_size=3, device="cpu", progress=False)
    return evaluate(EvaluateConfig(model=model, task=task, data=data, **options), resolve_scoring_source(load, tp))


def job_cloze(tp: int, pp: int, load: str, examples: list[tuple[list[int], list[int]]]) -> dict:
    """Per-example LAMBADA outcomes of token-level examples in a tp x pp layout."""
    from trainer.evaluation.lambada import ClozeExample, score_cloze
    from trainer.evaluation.scoring import EvalModelConfig, open_eval_model
    from trainer.models.dispatch import resolve_scoring_source

    config = EvalModelConfig(load=load, tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
                             batch_size=2, device="cpu", progress=False)
    with open_eval_model(config, resolve_scoring_source(load, tp)) as model:
        result = score_cloze(model, [ClozeExample(c, t) for c, t in examples], "examples")
    return {"hits": result.hits, "log_probs": result.log_probs}
