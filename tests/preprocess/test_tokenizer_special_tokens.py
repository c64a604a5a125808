"""Special tokens of the BERT and Hugging Face tokenizers (issue 10 §3).

BERT: no [CLS]/[SEP] by default (Megatron's BertDataset/T5Dataset add them), Megatron's
`--tokenizer-hf-no-include-special-tokens` accepted, `--tokenizer-bert-include-special-tokens` gives
Megatron HEAD's wrapped bytes. HuggingFaceTokenizer: the eod comes from the config files, else from
the tokenizer.json's own special tokens, else `--append-eod` is one line saying what to add.
"""

from __future__ import annotations

import json
import os
import shutil

import pytest
from tokenizers import Tokenizer as HFTokenizer

from indexed_dataset import IndexedDataset
from preprocess import cli
from preprocess.errors import TokenizerError
from preprocess.tokenizers import TokenizerConfig, build_tokenizer
from preprocess_testing import SAMPLE, TOKENIZERS, read_bytes, write_jsonl

BERT_FLAGS = ["--tokenizer-type", "BertWordPieceLowerCase", "--vocab-file", os.path.join(TOKENIZERS, "wordpiece-vocab.txt")]
HF_BPE = os.path.join(TOKENIZERS, "hf-bpe")


def _run(tmp_path, name: str, *flags: str, source: str = SAMPLE) -> int:
    return cli.main(["--input", source, "--output-prefix", str(tmp_path / name), *flags])


def test_bert_accepts_megatrons_no_special_tokens_flag_which_is_our_default(tmp_path):
    assert _run(tmp_path, "default", *BERT_FLAGS) == 0
    assert _run(tmp_path, "megatron", *BERT_FLAGS, "--tokenizer-hf-no-include-special-tokens") == 0
    for suffix in (".bin", ".idx"):
        assert read_bytes(str(tmp_path / f"default_text_document{suffix}")) == \
            read_bytes(str(tmp_path / f"megatron_text_document{suffix}"))


def test_bert_opt_in_wraps_every_document_in_cls_and_sep_as_megatron_head(tmp_path):
    assert _run(tmp_path, "plain", *BERT_FLAGS) == 0
    assert _run(tmp_path, "wrapped", *BERT_FLAGS, "--tokenizer-bert-include-special-tokens") == 0
    tokenizer = build_tokenizer(TokenizerConfig(tokenizer_type="BertWordPieceLowerCase", vocab_file=BERT_FLAGS[3]))
    cls, sep = tokenizer.backend.token_to_id("[CLS]"), tokenizer.backend.token_to_id("[SEP]")
    plain, wrapped = IndexedDataset(str(tmp_path / "plain_text_document")), IndexedDataset(str(tmp_path / "wrapped_text_document"))
    assert len(wrapped) >= len(plain)  # an empty text becomes [CLS] [SEP], a document of two tokens
    plain_documents = iter(plain[i].tolist() for i in range(len(plain)))
    for i in range(len(wrapped)):
        document = wrapped[i].tolist()
        assert document[0] == cls and document[-1] == sep
        if len(document) > 2:
            assert document[1:-1] == next(plain_documents)


@pytest.mark.parametrize(("flags", "message"), [
    (["--tokenizer-bert-include-special-tokens", "--tokenizer-hf-no-include-special-tokens"], "contradicts"),
    (["--tokenizer-type", "GPT2BPETokenizer"], "only applies to BertWordPieceLowerCase"),
])
def test_contradicting_or_inapplicable_special_token_flags_are_refused(tmp_path, capsys, flags, message):
    base = BERT_FLAGS if "GPT2BPETokenizer" not in flags else [
        "--vocab-file", os.path.join(os.path.dirname(TOKENIZERS), "gpt2", "gpt2-vocab.json"),
        "--merge-file", os.path.join(os.path.dirname(TOKENIZERS), "gpt2", "gpt2-merges.txt"),
        "--tokenizer-bert-include-special-tokens"]
    assert _run(tmp_path, "out", *base, *flags) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.splitlines()) == 1


def _tokenizer_json_only(tmp_path, rename_specials: dict[str, str] | None = None) -> str:
    """A directory holding only a copy of hf-bpe's tokenizer.json (special tokens optionally renamed)."""
    folder = tmp_path / "tokenizer"
    folder.mkdir()
    with open(os.path.join(HF_BPE, "tokenizer.json"), encoding="utf-8") as f:
        content = json.load(f)
    for token in content["added_tokens"]:
        token["content"] = (rename_specials or {}).get(token["content"], token["content"])
    (folder / "tokenizer.json").write_text(json.dumps(content), encoding="utf-8")
    return str(folder)


def test_a_tokenizer_json_alone_takes_its_own_special_end_of_text_token(tmp_path):
    folder = _tokenizer_json_only(tmp_path)
    with_config = build_tokenizer(TokenizerConfig(tokenizer_type="HuggingFaceTokenizer", tokenizer_model=HF_BPE))
    alone = build_tokenizer(TokenizerConfig(tokenizer_type="HuggingFaceTokenizer", tokenizer_model=folder))
    end_of_text = HFTokenizer.from_file(os.path.join(folder, "tokenizer.json")).token_to_id("</s>")
    assert alone.eod == with_config.eod == end_of_text


def test_no_end_of_document_token_is_one_line_saying_what_to_add(tmp_path, capsys):
    folder = _tokenizer_json_only(tmp_path, {"</s>": "<fin>"})
    tokenizer = build_tokenizer(TokenizerConfig(tokenizer_type="HuggingFaceTokenizer", tokenizer_model=folder))
    with pytest.raises(TokenizerError, match="eos_token"):
        tokenizer.eod
    source = write_jsonl(str(tmp_path / "in.jsonl"), [{"text": "hello"}])
    assert _run(tmp_path, "out", "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", folder,
                "--append-eod", source=source) == 1
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "tokenizer_config.json" in err and "<|endoftext|>" in err
    assert "Tokenizer has no" not in err  # never an internal class name


def test_an_eod_that_differs_from_the_models_eos_token_id_is_a_warning(tmp_path, caplog):
    folder = _tokenizer_json_only(tmp_path)
    shutil.copy(os.path.join(HF_BPE, "tokenizer_config.json"), folder)
    with open(os.path.join(folder, "config.json"), "w", encoding="utf-8") as f:
        json.dump({"eos_token_id": 12345}, f)
    tokenizer = build_tokenizer(TokenizerConfig(tokenizer_type="HuggingFaceTokenizer", tokenizer_model=folder))
    assert tokenizer.eod != 12345
    assert "eos_token_id 12345 differs" in caplog.text
