"""`evaluate` split over 2 CPU processes (gloo, under a timeout): TP 2, PP 2 and DP 2 give transformers'
LAMBADA outcomes and perplexity on the checkpoint ``convert-checkpoint --from-hf`` made, and the CLI
launches its own workers."""

import json

import numpy as np
import pytest
import torch
from evaluate_testing import (LAMBADA_SAMPLE, OVERLAP, PPL_RTOL, SEQ_LENGTH, WIKI_SAMPLE, checkpoint,  # noqa: F401
                              hf_row_scores, hf_tokenizer, job_cloze, job_evaluate, tiny_hf)
from hf_testing import hf_model
from process_testing import free_port, run_jobs

from trainer.cli.evaluate import main
from trainer.evaluation.lambada import ClozeExample, cloze_rows, read_lambada

LAYOUTS = {"tp2": (2, 1), "pp2": (1, 2), "dp2": (1, 1)}
PERPLEXITY = {"seq_length": SEQ_LENGTH, "overlapping_eval": OVERLAP}


@pytest.fixture(scope="module")
def examples(tiny_hf) -> list[tuple[list[int], list[int]]]:
    """Token-level cloze examples, every other one with transformers' greedy continuation as its target."""
    model, tokenizer = hf_model(tiny_hf), hf_tokenizer(tiny_hf)
    out = []
    for number, text in enumerate(read_lambada(LAMBADA_SAMPLE)[:8]):
        ids = tokenizer.encode(text)
        context, target = ids[:-2], ids[-2:]
        if number % 2 == 0:
            target = model.generate(torch.tensor([context]), do_sample=False, max_new_tokens=2,
                                    pad_token_id=50256)[0, len(context):].tolist()
        out.append((context, target))
    return out


@pytest.fixture(scope="module")
def two_process_run(checkpoint, examples, tmp_path_factory) -> dict:
    """Every layout's records from one 2-process launch."""
    jobs, names = [], []
    for name, (tp, pp) in LAYOUTS.items():
        jobs += [(job_evaluate, (tp, pp, str(checkpoint), "lambada", str(LAMBADA_SAMPLE), {"strict_lambada": True}), {}),
                 (job_evaluate, (tp, pp, str(checkpoint), "perplexity", str(WIKI_SAMPLE), PERPLEXITY), {}),
                 (job_cloze, (tp, pp, str(checkpoint), examples), {})]
        names += [(name, "lambada"), (name, "perplexity"), (name, "cloze")]
    results = run_jobs(2, jobs, tmp_path_factory.mktemp("eval_runs"))
    return dict(zip(names, results))


@pytest.fixture(scope="module")
def single_process(checkpoint) -> dict:
    """The one-process records (themselves checked against transformers in test_evaluate.py)."""
    from trainer.evaluation.evaluate import EvaluateConfig, evaluate
    from trainer.evaluation.scoring import EvalModelConfig
    from trainer.models.dispatch import resolve_scoring_source

    model = EvalModelConfig(load=str(checkpoint), progress=False)
    source = resolve_scoring_source(model.load, 1)
    return {"lambada": evaluate(EvaluateConfig(model=model, task="lambada", data=str(LAMBADA_SAMPLE),
                                               strict_lambada=True), source),
            "perplexity": evaluate(EvaluateConfig(model=model, task="perplexity", data=str(WIKI_SAMPLE),
                                                  **PERPLEXITY), source)}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_cloze_outcomes_equal_transformers(layout, two_process_run, examples, tiny_hf):
    want = hf_row_scores(hf_model(tiny_hf), cloze_rows([ClozeExample(c, t) for c, t in examples], "examples"))
    got = two_process_run[(layout, "cloze")]
    assert got["hits"] == [hit for _, hit in want] and 0 < sum(got["hits"]) < len(examples)
    assert np.allclose(got["log_probs"], [lp for lp, _ in want], rtol=PPL_RTOL, atol=0)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_lambada_and_perplexity_equal_one_process(layout, two_process_run, single_process):
    lambada, perplexity = two_process_run[(layout, "lambada")], two_process_run[(layout, "perplexity")]
    assert lambada == single_process["lambada"]
    for key in ("ppl", "adjusted_ppl", "avg_loss"):
        assert perplexity[key] == pytest.approx(single_process["perplexity"][key], rel=PPL_RTOL)
    assert perplexity["num_tokens"] == single_process["perplexity"]["num_tokens"]


def test_cli_launches_tensor_parallel_workers(checkpoint, single_process, capsys):
    argv = ["--task", "perplexity", "--data", str(WIKI_SAMPLE), "--load", str(checkpoint), "--seq-length",
            str(SEQ_LENGTH), "--overlapping-eval", str(OVERLAP), "--nproc-per-node", "2", "--device", "cpu",
            "--tensor-model-parallel-size", "2", "--master-port", str(free_port()), "--json"]
    assert main(argv) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["ppl"] == pytest.approx(single_process["perplexity"]["ppl"], rel=PPL_RTOL)
