"""SQuAD v1.1 / CMRC 2018 fine-tuning, evaluation and prediction with BERT (`trainer.models.bert.squad`).

Features map every gold answer of the shipped files back to its characters (English and Chinese); a tiny
BERT fine-tuned from scratch on a synthetic set whose answers follow a rule reaches F1 > 90 on its held-out
part (English WordPiece and a character-level Chinese vocabulary); the commands run end to end on the
shipped file, and the fine-tuned model exports as a BertForQuestionAnswering giving the same logits.
"""

from __future__ import annotations

import json

import pytest
import torch
from hf_testing import LOGIT_TOLERANCE
from squad_testing import CHINESE, ENGLISH, filler_words, write_synthetic_squad

from trainer.config import OptimizerConfig
from trainer.cli.convert import main as convert_main
from trainer.models.bert.squad.finetune_cli import main as finetune_main
from trainer.models.bert.squad.predict_cli import main as predict_main
from trainer.models.bert.squad.examples import parse_predict_inputs, read_squad_file
from trainer.models.bert.squad.features import FeatureOptions, build_features
from trainer.models.bert.squad.finetune import ScratchShape, SquadConfig, feature_batch, finetune, load_span_model, wordpiece_backend

LEARNED_F1 = 90.0
SMALL = FeatureOptions(max_seq_length=40, doc_stride=8, max_query_length=8)


@pytest.mark.parametrize("name, vocab", [("squad_sample.json", "tokenizers/wordpiece-vocab.txt"),
                                         ("cmrc_sample.json", "squad/chinese-vocab.txt")])
def test_every_gold_answer_maps_back_to_its_characters(name, vocab, data_test):
    examples = read_squad_file(data_test / "squad" / name)
    backend, _, _ = wordpiece_backend(str(data_test / vocab), True, None)
    # Windows of 46 context tokens sharing 16: long contexts become several features.
    features = build_features(examples, backend, FeatureOptions(max_seq_length=64, doc_stride=16, max_query_length=15))
    assert len(features) > len(examples)
    found = set()
    for feature in features:
        if feature.start_position:
            example = examples[feature.example_index]
            begin, end = feature.offsets[feature.start_position][0], feature.offsets[feature.end_position][1]
            assert example.context[begin:end] == example.answers[0][0]
            found.add(feature.example_index)
    assert found == set(range(len(examples)))


def test_malformed_files_and_inputs_fail_in_one_line(data_test, tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"data": [{"paragraphs": [{"context": "abc", "qas": [
        {"id": "1", "question": "q", "answers": [{"text": "xyz", "answer_start": 0}]}]}]}]}))
    assert finetune_main(["--task", "squad", "--train-file", str(bad), "--vocab-file",
                          str(data_test / "tokenizers" / "wordpiece-vocab.txt"), "--device", "cpu"]) != 0
    error = capsys.readouterr().err.strip()
    assert error.startswith("finetune: error:") and "data[0].paragraphs[0].qas[0].answers[0]" in error
    assert len(error.splitlines()) == 1
    with pytest.raises(ValueError, match="expected 'context - question'"):
        parse_predict_inputs(["no separator here"])


def synthetic_config(tmp_path, vocab, language, **overrides) -> SquadConfig:
    words = filler_words(vocab, language)
    train = write_synthetic_squad(tmp_path / "train.json", words, language, 800, seed=0)
    held_out = write_synthetic_squad(tmp_path / "held_out.json", words, language, 100, seed=1)
    return SquadConfig(train_file=str(train), valid_file=str(held_out), vocab_file=str(vocab), features=SMALL,
                       scratch=ScratchShape(num_layers=2, hidden_size=64, num_attention_heads=4, ffn_hidden_size=128),
                       optimizer=OptimizerConfig(lr=2e-3, min_lr=0.0, lr_warmup_fraction=0.1, lr_decay_style="linear"),
                       epochs=14, micro_batch_size=16, hidden_dropout=0.0, device="cpu", **overrides)


@pytest.mark.parametrize("language, vocab", [(ENGLISH, "tokenizers/wordpiece-vocab.txt"),
                                             (CHINESE, "squad/chinese-vocab.txt")], ids=["english", "chinese"])
def test_tiny_bert_learns_the_rule_to_f1_above_90_on_held_out_questions(language, vocab, data_test, tmp_path):
    result = finetune(synthetic_config(tmp_path, data_test / vocab, language, output_dir=str(tmp_path / "out")))
    assert result.metrics["f1"] > LEARNED_F1, result.metrics
    predictions = json.loads((tmp_path / "out" / "predictions.json").read_text(encoding="utf-8"))
    assert set(predictions) == {f"s{i}" for i in range(100)} and all(isinstance(v, str) for v in predictions.values())
    assert json.loads((tmp_path / "out" / "eval_results.json").read_text()) == pytest.approx(result.metrics)


def test_commands_finetune_evaluate_predict_and_export_end_to_end(data_test, tmp_path, capsys):
    import transformers

    sample = str(data_test / "squad" / "squad_sample.json")
    vocab = str(data_test / "tokenizers" / "wordpiece-vocab.txt")
    common = ["--max-seq-length", "40", "--doc-stride", "8", "--max-query-length", "16", "--device", "cpu"]
    assert finetune_main(["--task", "squad", "--train-file", sample, "--valid-file", sample, "--vocab-file", vocab,
                          "--save", str(tmp_path / "ckpt"), "--epochs", "1", "--micro-batch-size", "8",
                          "--lr", "1e-3", "--num-layers", "1", "--hidden-size", "32", "--ffn-hidden-size", "64",
                          *common]) == 0
    printed = capsys.readouterr().out.strip().splitlines()[-1]
    assert printed.startswith("{'exact_match': ") and "'f1': " in printed
    official = json.loads((tmp_path / "ckpt" / "predictions.json").read_text())
    assert len(official) == 25 and all(isinstance(text, str) for text in official.values())
    # Evaluation alone, from the saved checkpoint (its vocab.txt travelled with it), gives the same figures.
    assert finetune_main(["--task", "squad", "--valid-file", sample, "--load", str(tmp_path / "ckpt"),
                          "--output-dir", str(tmp_path / "eval"), *common]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == printed

    question = "Berlin is the capital of Germany. - What is the capital of Germany?"
    assert predict_main(["--load", str(tmp_path / "ckpt"), "--input", question, "--top-k", "2", *common]) == 0
    answers = eval(capsys.readouterr().out.strip())  # the printed Python list, as MindFormers prints it
    assert len(answers) == 2 and set(answers[0]) == {"text", "score", "start", "end"}
    assert question.split(" - ")[0][answers[0]["start"]:answers[0]["end"]] == answers[0]["text"]

    assert convert_main(["--from", str(tmp_path / "ckpt"), "--to-hf", str(tmp_path / "hf")]) == 0
    hf = transformers.BertForQuestionAnswering.from_pretrained(tmp_path / "hf").eval()
    ours = load_span_model(str(tmp_path / "ckpt"))
    examples = read_squad_file(sample)
    backend, _, _ = wordpiece_backend(vocab, True, None)
    batch = feature_batch(build_features(examples[:4], backend, FeatureOptions(max_seq_length=40, doc_stride=8,
                                                                                  max_query_length=16)))
    with torch.no_grad():
        theirs = hf(input_ids=batch.tokens, token_type_ids=batch.token_types, attention_mask=batch.padding_mask)
        start, end = ours(batch.tokens, batch.token_types, batch.padding_mask)
    assert torch.allclose(start, theirs.start_logits, atol=LOGIT_TOLERANCE, rtol=0)
    assert torch.allclose(end, theirs.end_logits, atol=LOGIT_TOLERANCE, rtol=0)
    # And the exported directory predicts as the checkpoint does.
    assert predict_main(["--load", str(tmp_path / "hf"), "--input", question, "--top-k", "2", *common]) == 0
    assert eval(capsys.readouterr().out.strip()) == answers
