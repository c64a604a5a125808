"""Special tokens read and written by name, for every tokenizer kind (issue 15 §1).

- every special token of a tokenizer (`</s>`, `[CLS]`, `<|endoftext|>`, Megatron's `<EOD>`, ...) typed in a
  text encodes to its id and decodes back to its name (`with_special_tokens`);
- T5's sentinels `<extra_id_k>` do the same (`t5_text_tokenizer`): appended after a plain SentencePiece
  model (Hugging Face's T5/mT5 convention: decoding them never reaches sentencepiece, whose
  "piece id is out of range" crashed generation), appended to a WordPiece vocabulary (none dropped),
  or a tokenizer.json's own `<extra_id_k>` tokens.
"""

from __future__ import annotations

import json
import os

import pytest
import sentencepiece
from preprocess_testing import SAMPLE, TOKENIZERS

from preprocess.tokenizers import TokenizerConfig, build_tokenizer
from preprocess.tokenizers.specials import with_special_tokens
from preprocess.tokenizers.t5 import t5_special_ids, t5_text_tokenizer

GPT2 = os.path.join(os.path.dirname(TOKENIZERS), "gpt2")
KINDS = {
    "megatron-sentencepiece": dict(tokenizer_type="SentencePieceTokenizer",
                                   tokenizer_model=os.path.join(TOKENIZERS, "sp-unigram.model")),
    "gpt-sentencepiece-bpe": dict(tokenizer_type="GPTSentencePieceTokenizer",
                                  tokenizer_model=os.path.join(TOKENIZERS, "sp-bpe.model")),
    "wordpiece": dict(tokenizer_type="BertWordPieceLowerCase",
                      vocab_file=os.path.join(TOKENIZERS, "wordpiece-vocab.txt")),
    "wordpiece-wrapped": dict(tokenizer_type="BertWordPieceLowerCase", tokenizer_bert_include_special_tokens=True,
                              vocab_file=os.path.join(TOKENIZERS, "wordpiece-vocab.txt")),
    "hf-bpe-with-bos": dict(tokenizer_type="HuggingFaceTokenizer", tokenizer_model=os.path.join(TOKENIZERS, "hf-bpe")),
    "hf-wordpiece": dict(tokenizer_type="HuggingFaceTokenizer",
                         tokenizer_model=os.path.join(TOKENIZERS, "hf-wordpiece")),
    "gpt2-bpe": dict(tokenizer_type="GPT2BPETokenizer", vocab_file=os.path.join(GPT2, "gpt2-vocab.json"),
                     merge_file=os.path.join(GPT2, "gpt2-merges.txt")),
}
CHINESE_PROMPT = "小明去年阅读<extra_id_0>的风景。"
SENTINELS = 10


@pytest.fixture(scope="module")
def t5_spiece(tmp_path_factory) -> str:
    """A tiny plain SentencePiece model laid out as T5/mT5's spiece.model: pad 0, EOS 1, unk 2, no sentinels."""
    folder = tmp_path_factory.mktemp("spiece")
    with open(SAMPLE, encoding="utf-8") as f:
        texts = [json.loads(line)["text"] for line in f]
    (folder / "corpus.txt").write_text("\n".join([*texts, "小明去年阅读了很多书,看到了美丽的风景。"]), encoding="utf-8")
    sentencepiece.SentencePieceTrainer.train(
        input=str(folder / "corpus.txt"), model_prefix=str(folder / "spiece"), vocab_size=300,
        model_type="unigram", character_coverage=1.0, num_threads=1, minloglevel=2,
        pad_id=0, eos_id=1, unk_id=2, bos_id=-1)
    return str(folder / "spiece.model")


@pytest.mark.parametrize("kind", KINDS)
def test_every_special_token_encodes_from_text_and_decodes_to_its_name(kind):
    tokenizer = build_tokenizer(TokenizerConfig(**KINDS[kind]))
    assert tokenizer.special_tokens, f"{kind} names no special token"
    text_tokenizer = with_special_tokens(tokenizer)
    for name, token_id in tokenizer.special_tokens.items():
        ids = text_tokenizer.encode(f"the cat {name} sat")
        assert ids.count(token_id) == 1 + tokenizer.affixes[0].count(token_id) + tokenizer.affixes[1].count(token_id)
        assert name in text_tokenizer.decode(ids)
        assert text_tokenizer.decode([token_id]) == name


@pytest.mark.parametrize("kind", KINDS)
def test_text_without_special_tokens_encodes_as_the_tokenizer_does(kind):
    tokenizer = build_tokenizer(TokenizerConfig(**KINDS[kind]))
    text = "The quick brown fox, twice: the quick brown fox."
    assert with_special_tokens(tokenizer).encode(text) == tokenizer.encode(text)


def test_hugging_face_sentinels_after_a_plain_sentencepiece_model(t5_spiece):
    tokenizer = build_tokenizer(TokenizerConfig(tokenizer_type="GPTSentencePieceTokenizer", tokenizer_model=t5_spiece))
    special = t5_special_ids(tokenizer, "GPTSentencePieceTokenizer", 100)
    t5 = t5_text_tokenizer(tokenizer, special)
    assert special.sentinels[0] == tokenizer.vocab_size + 99  # <extra_id_0> last, as T5Tokenizer numbers it
    ids = t5.encode(CHINESE_PROMPT)
    assert ids.count(special.sentinels[0]) == 1 and 2 not in ids  # the sentinel, and no <unk>
    assert t5.decode(ids).replace(" ", "") == CHINESE_PROMPT
    # What a span-corruption model generates first: sentinels (ids past sentencepiece's pieces) and EOS.
    generated = [special.sentinels[0], *tokenizer.encode("hello"), special.sentinels[1], special.eos]
    assert t5.decode(generated).split() == ["<extra_id_0>", "hello", "<extra_id_1>", "</s>"]


def test_sentinels_appended_to_a_wordpiece_vocabulary_are_never_dropped():
    tokenizer = build_tokenizer(TokenizerConfig(**KINDS["wordpiece"]))
    special = t5_special_ids(tokenizer, "BertWordPieceLowerCase", 100)
    t5 = t5_text_tokenizer(tokenizer, special)
    text = t5.decode(list(special.sentinels[:SENTINELS]))
    assert text.split() == [f"<extra_id_{k}>" for k in range(SENTINELS)]
    assert t5.encode(text) == list(special.sentinels[:SENTINELS])
    assert t5.decode([special.decoder_start, special.eos]) == "[BOS] [EOS]"  # Megatron's appended tokens


def test_a_tokenizer_json_with_its_own_sentinels(tmp_path):
    folder = tmp_path / "t5-tokenizer"
    folder.mkdir()
    with open(os.path.join(TOKENIZERS, "hf-wordpiece", "tokenizer.json"), encoding="utf-8") as f:
        content = json.load(f)
    next_id = max(token["id"] for token in content["added_tokens"]) + len(content["model"]["vocab"])
    content["added_tokens"] += [{"id": next_id + k, "content": f"<extra_id_{k}>", "single_word": False, "lstrip": False,
                                 "rstrip": False, "normalized": False, "special": True} for k in range(3)]
    (folder / "tokenizer.json").write_text(json.dumps(content), encoding="utf-8")
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "[SEP]", "pad_token": "[PAD]"}))
    tokenizer = build_tokenizer(TokenizerConfig(tokenizer_type="HuggingFaceTokenizer", tokenizer_model=str(folder)))
    special = t5_special_ids(tokenizer, "HuggingFaceTokenizer", 100)
    assert special.sentinels == tuple(tokenizer.special_tokens[f"<extra_id_{k}>"] for k in range(3))
    t5 = t5_text_tokenizer(tokenizer, special)
    ids = t5.encode("hello <extra_id_2> world")
    assert special.sentinels[2] in ids and t5.decode(ids).split()[1] == "<extra_id_2>"
