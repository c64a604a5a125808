"""lm-evaluation-harness on tokenmill: the request kinds answered by `HarnessScorer` equal transformers' on
the same weights (always run), and lm-eval's ``--model tokenmill`` gives the loglikelihoods of its own
``--model hf`` on a local task over ``data_test/evaluate/`` (run when the ``eval`` extra is installed;
lm-eval is not a test dependency: some 40 packages)."""

import numpy as np
import pytest
import torch
from evaluate_testing import LAMBADA_SAMPLE, PPL_RTOL, hf_tokenizer, tiny_hf  # noqa: F401
from hf_testing import hf_loglikelihood, hf_model

from trainer.evaluation.harness import HarnessScorer, rolling_windows
from trainer.evaluation.lambada import read_lambada
from trainer.evaluation.scoring import EvalModelConfig, open_eval_model
from trainer.models.dispatch import resolve_scoring_source

EOT = 50256


@pytest.fixture(scope="module")
def scorer(tiny_hf):
    with open_eval_model(EvalModelConfig(load=str(tiny_hf), batch_size=4, progress=False),
                         resolve_scoring_source(str(tiny_hf), 1)) as model:
        yield HarnessScorer(model)


def test_loglikelihood_equals_transformers_with_lm_evals_tokenisation(tiny_hf, scorer):
    model, tokenizer = hf_model(tiny_hf), hf_tokenizer(tiny_hf)
    requests = [(text.rsplit(" ", 1)[0] + " ", text.rsplit(" ", 1)[1]) for text in read_lambada(LAMBADA_SAMPLE)[:6]]
    requests.append(("", "Hello world"))
    ours = scorer.loglikelihood(requests)
    for (context, continuation), (log_prob, greedy) in zip(requests, ours):
        if context:  # lm-eval moves the context's trailing space into the continuation, encodes both whole
            context, continuation = context.rstrip(), " " + continuation
            whole, context_ids = tokenizer.encode(context + continuation), tokenizer.encode(context)
            pair = (context_ids, whole[len(context_ids):])
        else:
            pair = ([EOT], tokenizer.encode(continuation))
        want = hf_loglikelihood(model, *pair)
        assert log_prob == pytest.approx(want[0], rel=PPL_RTOL) and greedy == want[1]


def test_greedy_flag_is_true_for_the_models_own_continuation(tiny_hf, scorer):
    model, tokenizer = hf_model(tiny_hf), hf_tokenizer(tiny_hf)
    context = tokenizer.encode("The lighthouse keeper wrote")
    greedy = model.generate(torch.tensor([context]), do_sample=False, max_new_tokens=3, pad_token_id=EOT)
    [(_, is_greedy), (_, not_greedy)] = scorer.loglikelihood_tokens([(context, greedy[0, len(context):].tolist()),
                                                                     (context, [11, 12, 13])])
    assert is_greedy and not not_greedy


def test_rolling_windows_are_lm_evals():
    from_lm_eval = pytest.importorskip("lm_eval.utils")
    tokens = list(range(300))
    for max_length in (1, 7, 128, 300, 400):
        want = [from_lm_eval.make_disjoint_window(w) for w in
                from_lm_eval.get_rolling_token_windows(tokens, EOT, max_length, context_len=1)]
        assert list(rolling_windows(tokens, EOT, max_length)) == want


def test_loglikelihood_rolling_equals_transformers_over_windows(tiny_hf, scorer):
    model, tokenizer = hf_model(tiny_hf), hf_tokenizer(tiny_hf)
    text = " ".join(read_lambada(LAMBADA_SAMPLE)[:4])  # ~180 tokens: two windows of the model's 128 positions
    tokens = tokenizer.encode(text)
    assert len(tokens) > 128
    # the second window: the last 128 inputs before the end, predicting the tokens the first did not
    n = len(tokens)
    want = hf_loglikelihood(model, [EOT], tokens[:128])[0] + hf_loglikelihood(model, tokens[n - 129:128],
                                                                              tokens[128:])[0]
    assert scorer.loglikelihood_rolling([text])[0] == pytest.approx(want, rel=PPL_RTOL)
    windows = list(rolling_windows(tokens, EOT, 128))
    assert [len(c) for c, _ in windows] == [1, 257 - n] and sum(len(t) for _, t in windows) == len(tokens)


def test_generate_until_is_greedy_and_stops_at_the_stop_string(tiny_hf, scorer):
    model, tokenizer = hf_model(tiny_hf), hf_tokenizer(tiny_hf)
    context = "Every winter the lake froze"
    ids = tokenizer.encode(context)
    greedy = model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=6, pad_token_id=EOT)
    text = tokenizer.decode(greedy[0, len(ids):].tolist())
    [full] = scorer.generate_until([(context, {"until": [], "max_gen_toks": 6, "do_sample": False})])
    assert full == text.split(tokenizer.decode([EOT]))[0]
    stop = full[len(full) // 2:][:2] or "x"
    [cut] = scorer.generate_until([(context, {"until": [stop], "max_gen_toks": 6})])
    assert cut == full.split(stop)[0]


LOCAL_TASK = """task: tokenmill_cloze
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: loglikelihood
doc_to_text: "{{{{text.rsplit(' ', 1)[0]}}}}"
doc_to_target: "{{{{' ' + text.rsplit(' ', 1)[1]}}}}"
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
"""


def test_lm_eval_tokenmill_equals_lm_eval_hf_on_a_local_task(tiny_hf, tmp_path):
    lm_eval = pytest.importorskip("lm_eval")
    from lm_eval.tasks import TaskManager

    import trainer.cli.lm_eval  # noqa: F401  (registers --model tokenmill)

    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "tokenmill_cloze.yaml").write_text(LOCAL_TASK.format(data=LAMBADA_SAMPLE))
    manager = TaskManager(include_path=str(tasks))
    common = {"tasks": ["tokenmill_cloze"], "task_manager": manager, "log_samples": True, "batch_size": 4,
              "device": "cpu"}
    ours = lm_eval.simple_evaluate(model="tokenmill", model_args=f"load={tiny_hf}", **common)
    theirs = lm_eval.simple_evaluate(model="hf", model_args=f"pretrained={tiny_hf},dtype=float32", **common)

    def loglikelihoods(results):
        samples = sorted(results["samples"]["tokenmill_cloze"], key=lambda s: s["doc_id"])
        return [[tuple(r) for r in s["resps"][0]] for s in samples]

    got, want = loglikelihoods(ours), loglikelihoods(theirs)
    assert len(got) == 20
    assert np.allclose([g[0][0] for g in got], [w[0][0] for w in want], rtol=PPL_RTOL, atol=0)
    assert [g[0][1] for g in got] == [w[0][1] for w in want]
    assert ours["results"]["tokenmill_cloze"]["acc,none"] == theirs["results"]["tokenmill_cloze"]["acc,none"]
