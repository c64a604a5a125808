"""`evaluate` in one process: LAMBADA and perplexity equal transformers' on the same weights and text (after
``convert-checkpoint --from-hf``), Megatron's windows and detokeniser, token files, and the CLI's output
and one-line errors."""

import json
import math

import numpy as np
import pytest
from evaluate_testing import (LAMBADA_SAMPLE, OVERLAP, PPL_RTOL, SEQ_LENGTH, WIKI_SAMPLE, checkpoint,  # noqa: F401
                              hf_row_scores, hf_tokenizer, tiny_hf)
from hf_testing import hf_model

from trainer.cli.evaluate import main
from trainer.evaluation.detokenize import detokenize_wikitext, detokenizer_for
from trainer.evaluation.evaluate import EvaluateConfig, evaluate
from trainer.evaluation.lambada import ClozeExample, cloze_example, cloze_rows, read_lambada, score_cloze
from trainer.evaluation.perplexity import lm_windows
from trainer.evaluation.scoring import EvalModelConfig, open_eval_model
from trainer.models.dispatch import resolve_scoring_source


def run(load, task, data, **options) -> dict:
    model = EvalModelConfig(load=str(load), batch_size=3, progress=False)
    return evaluate(EvaluateConfig(model=model, task=task, data=str(data), **options),
                    resolve_scoring_source(model.load, model.tensor_model_parallel_size))


def hf_lambada(tiny_hf, strict: bool) -> list[tuple[float, bool]]:
    """transformers' outcome of each sample passage, tokenised by transformers' GPT-2 tokenizer."""
    tokenizer = hf_tokenizer(tiny_hf)
    examples = []
    for text in read_lambada(LAMBADA_SAMPLE):
        if strict:
            word = text.split()[-1]
            start = text.rfind(word)
            examples.append(ClozeExample(tokenizer.encode(text[:start].strip()), tokenizer.encode(" " + word)))
        else:
            ids = tokenizer.encode(text)
            examples.append(ClozeExample(ids[:-1], ids[-1:]))
    return hf_row_scores(hf_model(tiny_hf), cloze_rows(examples, "sample"))


@pytest.mark.parametrize("strict", [True, False])
def test_lambada_accuracy_equals_transformers(tiny_hf, checkpoint, strict):
    want = hf_lambada(tiny_hf, strict)
    record = run(checkpoint, "lambada", LAMBADA_SAMPLE, strict_lambada=strict)
    assert record["count"] == 20
    assert record["correct"] == sum(hit for _, hit in want)
    assert record["accuracy"] == sum(hit for _, hit in want) / 20


def test_cloze_outcomes_equal_transformers_passage_by_passage(tiny_hf, checkpoint):
    """A random model rarely guesses a word: half the examples here take transformers' own greedy
    continuation as target, so the accuracy is neither 0 nor 1 and every hit is checked."""
    model = hf_model(tiny_hf)
    tokenizer = hf_tokenizer(tiny_hf)
    examples = []
    for number, text in enumerate(read_lambada(LAMBADA_SAMPLE)):
        ids = tokenizer.encode(text)
        context, target = ids[:-3], ids[-3:]
        if number % 2 == 0:
            target = model.generate(__import__("torch").tensor([context]), do_sample=False, max_new_tokens=3,
                                    pad_token_id=50256)[0, len(context):].tolist()
        examples.append(ClozeExample(context, target))
    want = hf_row_scores(model, cloze_rows(examples, "sample"))
    with open_eval_model(EvalModelConfig(load=str(checkpoint), batch_size=4, progress=False),
                         resolve_scoring_source(str(checkpoint), 1)) as ours:
        result = score_cloze(ours, examples, "sample")
    assert result.hits == [hit for _, hit in want] and 0 < result.correct < 20
    assert np.allclose(result.log_probs, [lp for lp, _ in want], rtol=PPL_RTOL, atol=0)


def test_our_tokens_are_transformers_tokens(tiny_hf, checkpoint):
    tokenizer = hf_tokenizer(tiny_hf)
    with open_eval_model(EvalModelConfig(load=str(checkpoint), progress=False),
                         resolve_scoring_source(str(checkpoint), 1)) as model:
        for text in read_lambada(LAMBADA_SAMPLE):
            ours = cloze_example(text, model.tokenizer, strict=True)
            word = text.split()[-1]
            assert ours.target == tokenizer.encode(" " + word)
            assert ours.context == tokenizer.encode(text[:text.rfind(word)].strip())
        text = detokenize_wikitext(WIKI_SAMPLE.read_text(encoding="utf-8"))
        assert model.tokenizer.encode(text) == tokenizer.encode(text)


def hf_perplexity(tiny_hf, seq_length: int, overlap: int) -> tuple[float, float]:
    """transformers' perplexity and adjusted perplexity of the WikiText-like sample, computed here from
    Megatron's definitions (word count: the original text split on single spaces)."""
    raw = WIKI_SAMPLE.read_text(encoding="utf-8")
    tokens = np.array(hf_tokenizer(tiny_hf).encode(detokenize_wikitext(raw)), dtype=np.int64)
    scores = hf_row_scores(hf_model(tiny_hf), lm_windows(tokens, seq_length, overlap, 50256))
    loss = -sum(lp for lp, _ in scores) / (len(tokens) - 1)
    ratio = (len(tokens) - 1) / (len(raw.strip().split(" ")) - 1)
    return math.exp(loss), math.exp(loss * ratio)


@pytest.mark.parametrize("overlap", [OVERLAP, SEQ_LENGTH])
def test_perplexity_equals_transformers(tiny_hf, checkpoint, overlap):
    ppl, adjusted = hf_perplexity(tiny_hf, SEQ_LENGTH, overlap)
    record = run(checkpoint, "perplexity", WIKI_SAMPLE, seq_length=SEQ_LENGTH, overlapping_eval=overlap)
    assert record["ppl"] == pytest.approx(ppl, rel=PPL_RTOL)
    assert record["adjusted_ppl"] == pytest.approx(adjusted, rel=PPL_RTOL)
    assert record["num_original_tokens"] == len(WIKI_SAMPLE.read_text().strip().split(" "))


def test_windows_score_every_target_once_with_megatrons_context():
    tokens = np.arange(23, dtype=np.int64)
    rows = lm_windows(tokens, seq_len=8, overlapping_eval=3, pad_id=-1)
    scored = [int(row.ids[t + 1]) for row in rows for t in range(row.first, row.last)]
    assert scored == list(range(1, 23))
    assert [int(row.ids[0]) for row in rows] == list(range(0, 3 * len(rows), 3))
    assert all(len(row.ids) == 9 for row in rows)
    # after the first window each scored target sees seq_len - overlapping_eval earlier tokens at least
    assert all(row.first == 5 for row in rows[1:])
    disjoint = lm_windows(tokens, seq_len=8, overlapping_eval=8, pad_id=-1)
    assert [(row.first, row.last) for row in disjoint] == [(0, 8), (0, 8), (0, 6)]


def test_wikitext_detokeniser_follows_megatron():
    raw = ' = = Early life = = \n He was born in 1 @,@ 200 B.C. ( roughly ) , in a 3 @.@ 5 m @-@ wide house . \n'
    assert detokenize_wikitext(raw) == ' == Early life ==\nHe was born in 1,200 B.C. (roughly), in a 3.5 m-wide house.\n'
    assert detokenize_wikitext("the players ' union ; \" quoted \" , N") == "the players' union; \"quoted\", N"
    assert detokenizer_for("data/wiki.test.tokens") is detokenize_wikitext
    assert detokenizer_for("data/other.txt")("a @-@ b") == "a @-@ b"
    assert detokenizer_for("data/wiki.test.tokens", "none")("a @-@ b") == "a @-@ b"


def test_token_file_perplexity_equals_the_text_it_holds(checkpoint, tmp_path):
    from indexed_dataset.writer import IndexedDatasetWriter

    with open_eval_model(EvalModelConfig(load=str(checkpoint), progress=False),
                         resolve_scoring_source(str(checkpoint), 1)) as model:
        tokens = model.tokenizer.encode(detokenize_wikitext(WIKI_SAMPLE.read_text(encoding="utf-8")))
    with IndexedDatasetWriter(str(tmp_path / "wiki_text_document"), np.uint16) as writer:
        writer.add_item(tokens[:100])
        writer.end_document()
        writer.add_item(tokens[100:])
        writer.end_document()
    from_tokens = run(checkpoint, "perplexity", tmp_path / "wiki_text_document.bin", seq_length=SEQ_LENGTH)
    from_text = run(checkpoint, "perplexity", WIKI_SAMPLE, seq_length=SEQ_LENGTH)
    assert from_tokens["ppl"] == from_text["ppl"] and from_tokens["num_tokens"] == len(tokens)
    assert from_tokens["adjusted_ppl"] is None and from_tokens["num_original_tokens"] is None


def test_cli_prints_results_then_one_json_line(tiny_hf, capsys):
    argv = ["--task", "perplexity", "--data", str(WIKI_SAMPLE), "--load-hf", str(tiny_hf), "--seq-length", "48",
            "--overlapping-eval", "16"]
    assert main([*argv, "--json"]) == 0
    captured = capsys.readouterr()
    record = json.loads(captured.out)
    assert record == run(tiny_hf, "perplexity", WIKI_SAMPLE, seq_length=48, overlapping_eval=16)
    assert captured.err == ""  # no progress bar for machines
    assert main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"perplexity {WIKI_SAMPLE}: avg loss") and "adjusted ppl" in lines[1]
    assert json.loads(lines[-1]) == record
    assert main(["--task", "lambada", "--data", str(LAMBADA_SAMPLE), "--load", str(tiny_hf), "--strict-lambada"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"lambada {LAMBADA_SAMPLE}: accuracy") and json.loads(out[-1])["count"] == 20


def test_other_families_are_refused_in_one_line(tmp_path, capsys):
    t5 = tmp_path / "t5"
    t5.mkdir()
    (t5 / "config.json").write_text(json.dumps({"model_type": "t5"}))
    assert main(["--task", "lambada", "--data", str(LAMBADA_SAMPLE), "--load", str(t5)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is a t5 model; evaluation scores gpt models only" in err


@pytest.mark.parametrize("content, argv, message", [
    ('{"text": "a b c"}\nnot json\n', [], "line 2: not JSON"),
    ('{"text": "a b c"}\n{"txt": "x"}\n', [], 'line 2: expected an object with a non-empty "text" string'),
    ("\n\n", [], ": no passage"),
    ('{"text": "' + "word " * 200 + '"}\n', [], "row 0 needs"),
    ('{"text": "Hello"}\n', ["--strict-lambada"], "passage 1: no context tokens"),
    ('{"text": "a b c"}\n', ["--tensor-model-parallel-size", "3", "--nproc-per-node", "3"],
     "num_attention_heads (4) is not divisible by --tensor-model-parallel-size (3)"),
])
def test_bad_input_is_one_line_naming_the_file(tiny_hf, tmp_path, capsys, content, argv, message):
    data = tmp_path / "lambada.jsonl"
    data.write_text(content)
    assert main(["--task", "lambada", "--data", str(data), "--load", str(tiny_hf), *argv]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err
    if "row" in message or "line" in message or "passage" in message or "no passage" in message:
        assert str(data) in err


def test_perplexity_flag_ranges_are_one_line(tiny_hf, capsys):
    base = ["--task", "perplexity", "--data", str(WIKI_SAMPLE), "--load", str(tiny_hf)]
    assert main([*base, "--seq-length", "500"]) == 1
    assert "--seq-length (500) must be in [1, 128]" in capsys.readouterr().err
    assert main([*base, "--seq-length", "32", "--overlapping-eval", "40"]) == 1
    assert "--overlapping-eval (40) must be in [1, --seq-length (32)]" in capsys.readouterr().err
