"""``evaluate`` and the lm-eval adapter on Hugging Face Llama-class models (issue 30, points 3 and 4).

- lm-eval's loglikelihood requests answered by `HarnessScorer` (the ``tokenmill`` model of lm-eval) on a Llama 3
  and a Mixtral directory equal transformers' log-probabilities and greedy flags;
- ``evaluate --task perplexity`` reads the text with ``--tokenizer-type Llama2Tokenizer --tokenizer-model``,
  and a HF directory and the checkpoint ``convert-checkpoint --from-hf`` made of it give the same record.
"""

from __future__ import annotations

import json

import pytest
import sentencepiece
import torch
from evaluate_testing import PPL_RTOL, WIKI_SAMPLE
from hf_llama_testing import SP_BPE, add_tokenizer_files, hf_llama, make_tiny_llama
from hf_testing import hf_loglikelihood, prompt_batch

from trainer.cli.convert import main as convert
from trainer.cli.evaluate import main as evaluate_cli
from trainer.evaluation.harness import HarnessScorer
from trainer.evaluation.scoring import EvalModelConfig, open_eval_model
from trainer.models.dispatch import resolve_scoring_source


@pytest.mark.parametrize("variant", ["llama3", "mixtral"])
def test_harness_loglikelihoods_equal_transformers(tmp_path, variant):
    vocab = sentencepiece.SentencePieceProcessor(model_file=SP_BPE)
    source = make_tiny_llama(tmp_path / variant, variant, vocab_size=vocab.get_piece_size(),
                             bos_token_id=vocab.bos_id(), eos_token_id=vocab.eos_id())
    add_tokenizer_files(source)  # lm-eval's requests come with the model's tokenizer
    model = hf_llama(source)
    contexts, continuations = prompt_batch((5, 9, 1), seed=4), prompt_batch((3, 1, 6), seed=5)
    requests = list(zip(contexts, continuations))
    # The model's own greedy continuation of one context: its flag must be True.
    greedy = model.generate(torch.tensor([contexts[1]]), do_sample=False, max_new_tokens=3, pad_token_id=0)
    requests.append((contexts[1], greedy[0, len(contexts[1]):].tolist()))
    with open_eval_model(EvalModelConfig(load=str(source), batch_size=2, progress=False),
                         resolve_scoring_source(str(source), 1)) as ours:
        scores = HarnessScorer(ours).loglikelihood_tokens(requests)
    for (context, continuation), (log_prob, is_greedy) in zip(requests, scores):
        want = hf_loglikelihood(model, context, continuation)
        assert log_prob == pytest.approx(want[0], rel=PPL_RTOL) and is_greedy == want[1]
    assert scores[-1][1]


def test_perplexity_with_the_llama2_tokenizer_from_directory_and_checkpoint(tmp_path, capsys):
    vocab = sentencepiece.SentencePieceProcessor(model_file=SP_BPE)
    source = make_tiny_llama(tmp_path / "llama", "llama3", vocab_size=vocab.get_piece_size(),
                             bos_token_id=vocab.bos_id(), eos_token_id=vocab.eos_id())
    assert convert(["--from-hf", str(source), "--to", str(tmp_path / "ckpt")]) == 0
    records = []
    for flag, load in (("--load-hf", source), ("--load", tmp_path / "ckpt")):
        capsys.readouterr()
        assert evaluate_cli(["--task", "perplexity", "--data", str(WIKI_SAMPLE), flag, str(load), "--seq-length", "48",
                             "--overlapping-eval", "16", "--json", "--tokenizer-type", "Llama2Tokenizer",
                             "--tokenizer-model", SP_BPE]) == 0
        records.append(json.loads(capsys.readouterr().out))
    assert records[0]["ppl"] == pytest.approx(records[1]["ppl"], rel=PPL_RTOL)
    assert records[0]["num_tokens"] == records[1]["num_tokens"] > 0
