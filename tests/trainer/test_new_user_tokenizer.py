"""A checkpoint remembers its tokenizer (issue 27, point 1).

Promised, for every tokenizer kind (GPT-2 vocab + merges, WordPiece vocab cased and uncased, SentencePiece
models in both of Megatron's flavours, tokenizer.json, NullTokenizer), as a user types the commands:

- ``train ... <tokenizer flags> --save RUN`` stores the tokenizer beside ``model_config.json``;
- ``generate --load RUN --prompt TEXT``, ``evaluate --load RUN`` and ``train --load RUN`` (resume) need no
  tokenizer flag;
- ``convert-checkpoint --from RUN --to-hf HF`` writes the tokenizer in Hugging Face's form, and
  ``transformers.AutoTokenizer.from_pretrained(HF)`` gives the ids our tokenizer gives (BERT's WordPiece
  as transformers' BertTokenizer, whose [CLS] ... [SEP] wrapping ``add_special_tokens=False`` leaves out).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from preprocess.tokenizers import TokenizerConfig, build_tokenizer
from trainer.checkpoint.tokenizer_record import recorded_tokenizer
from trainer.cli.train import main as train
from trainer.cli.convert import main as convert_checkpoint
from trainer.cli.evaluate import main as evaluate
from trainer.cli.generate import main as generate

DATA_TEST = Path(__file__).resolve().parents[2] / "data_test"
TOKENIZERS = DATA_TEST / "tokenizers"
# kind -> (tokenizer flags, whether transformers wraps the text in special tokens ours leave out)
KINDS = {
    "gpt2": (["--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", str(DATA_TEST / "gpt2" / "gpt2-vocab.json"),
              "--merge-file", str(DATA_TEST / "gpt2" / "gpt2-merges.txt")], False),
    "wordpiece-lower": (["--tokenizer-type", "BertWordPieceLowerCase", "--vocab-file",
                         str(TOKENIZERS / "wordpiece-vocab.txt")], True),
    "wordpiece-case": (["--tokenizer-type", "BertWordPieceCase", "--vocab-file",
                        str(TOKENIZERS / "wordpiece-vocab.txt")], True),
    "sentencepiece-gpt": (["--tokenizer-type", "GPTSentencePieceTokenizer", "--tokenizer-model",
                           str(TOKENIZERS / "sp-unigram.model")], False),
    "sentencepiece-megatron": (["--tokenizer-type", "SentencePieceTokenizer", "--tokenizer-model",
                                str(TOKENIZERS / "sp-bpe.model")], False),
    "tokenizer-json-dir": (["--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model",
                            str(TOKENIZERS / "hf-bpe")], False),
    "tokenizer-json-file": (["--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model",
                             str(TOKENIZERS / "hf-wordpiece" / "tokenizer.json")], False),
    "null": (["--tokenizer-type", "NullTokenizer", "--vocab-size", "300"], False),
}
TINY_MODEL = ["--num-layers", "1", "--hidden-size", "32", "--num-attention-heads", "2", "--seq-length", "32",
              "--micro-batch-size", "2", "--global-batch-size", "2", "--eval-iters", "0", "--device", "cpu",
              "--split", "98,1,1"]
TEXTS = ["Hello, my name is", "The quick brown fox jumps over the lazy dog.", "  two  spaces and\nnew lines ",
         "Numbers 12345, accents: café naïve, UPPER case."]


def _train(tiny_prefix: str, cache_dir: str, run: Path, iters: int, *flags: str) -> int:
    return train(["--dataset", tiny_prefix, "--data-cache-path", cache_dir, *TINY_MODEL, "--train-iters", str(iters),
                  "--save", str(run), *flags])


@pytest.fixture(scope="module")
def runs(tiny_prefix, cache_dir, tmp_path_factory) -> dict[str, Path]:
    """One 1-step run per tokenizer kind, saved with its tokenizer flags."""
    root = tmp_path_factory.mktemp("tokenizer_runs")
    saved = {}
    for kind, (flags, _) in KINDS.items():
        assert _train(tiny_prefix, cache_dir, root / kind, 1, *flags) == 0, kind
        saved[kind] = root / kind
    return saved


def _user_config(flags: list[str]) -> TokenizerConfig:
    values = dict(zip(flags[::2], flags[1::2]))
    return TokenizerConfig(tokenizer_type=values["--tokenizer-type"], vocab_file=values.get("--vocab-file"),
                           merge_file=values.get("--merge-file"), tokenizer_model=values.get("--tokenizer-model"),
                           vocab_size=int(values["--vocab-size"]) if "--vocab-size" in values else None)


@pytest.mark.parametrize("kind", KINDS)
def test_checkpoint_records_the_tokenizer(runs, kind):
    flags, _ = KINDS[kind]
    recorded = recorded_tokenizer(runs[kind])
    assert recorded is not None and recorded.tokenizer_type == _user_config(flags).tokenizer_type
    ours, stored = build_tokenizer(_user_config(flags)), build_tokenizer(recorded)
    texts = ["1 2 3 299"] if kind == "null" else TEXTS
    assert [stored.encode(text) for text in texts] == [ours.encode(text) for text in texts]
    # Stored under the checkpoint root, not pointing back at the user's files.
    for name in ("vocab_file", "merge_file", "tokenizer_model"):
        if getattr(recorded, name) is not None:
            assert Path(getattr(recorded, name)).parent == runs[kind]


@pytest.mark.parametrize("kind", KINDS)
def test_generate_needs_no_tokenizer_flag(runs, kind, capsys):
    prompt = "1 2 3" if kind == "null" else "Hello, my name is"
    assert generate(["--load", str(runs[kind]), "--prompt", prompt, "--max-new-tokens", "2", "--device", "cpu"]) == 0
    assert "Traceback" not in capsys.readouterr().err


@pytest.mark.parametrize("kind", ["gpt2", "sentencepiece-gpt", "tokenizer-json-dir"])
def test_evaluate_needs_no_tokenizer_flag(runs, kind, tmp_path, capsys):
    text = tmp_path / "wiki.txt"
    text.write_text(" ".join(TEXTS * 4) + "\n", encoding="utf-8")
    assert evaluate(["--task", "perplexity", "--data", str(text), "--load", str(runs[kind]), "--json",
                     "--device", "cpu"]) == 0
    assert "perplexity" in capsys.readouterr().out


@pytest.mark.parametrize("kind", ["wordpiece-case", "sentencepiece-megatron", "null"])
def test_resume_keeps_the_tokenizer(runs, kind, tiny_prefix, cache_dir, tmp_path):
    """``train --load RUN`` with no tokenizer flag trains on, and its checkpoint records the same tokenizer."""
    resumed = tmp_path / "resumed"
    assert train(["--dataset", tiny_prefix, "--data-cache-path", cache_dir, "--train-iters", "2",
                  "--micro-batch-size", "2", "--global-batch-size", "2", "--eval-iters", "0", "--device", "cpu",
                  "--split", "98,1,1", "--load", str(runs[kind]), "--save", str(resumed)]) == 0
    assert recorded_tokenizer(resumed).tokenizer_type == recorded_tokenizer(runs[kind]).tokenizer_type


@pytest.mark.parametrize("kind", [kind for kind in KINDS if kind != "null"])
def test_exported_tokenizer_gives_our_ids_in_transformers(runs, kind, tmp_path):
    transformers = pytest.importorskip("transformers")
    flags, wrapped = KINDS[kind]
    hf = tmp_path / "hf"
    assert convert_checkpoint(["--from", str(runs[kind]), "--to-hf", str(hf)]) == 0
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        assert json.loads((hf / name).read_text())  # Hugging Face's description is there
    theirs = transformers.AutoTokenizer.from_pretrained(str(hf))
    ours = build_tokenizer(_user_config(flags))
    texts = [json.loads(line)["text"] for line in (DATA_TEST / "sample_en.jsonl").read_text().splitlines()[:20]]
    for text in TEXTS + texts:
        assert theirs(text, add_special_tokens=not wrapped).input_ids == ours.encode(text), text
    # BERT's end of document is its [SEP]; transformers' BertTokenizer has no eos_token.
    assert (theirs.sep_token_id if wrapped else theirs.eos_token_id) == ours.eod


def test_null_tokenizer_export_writes_no_hf_tokenizer(runs, tmp_path):
    """transformers has no tokenizer that reads ids written as text: the export holds the model alone."""
    hf = tmp_path / "hf"
    assert convert_checkpoint(["--from", str(runs["null"]), "--to-hf", str(hf)]) == 0
    assert not (hf / "tokenizer_config.json").exists()
