"""Trains the tiny tokenizers in this directory from ../sample_en.jsonl (offline, a few seconds).

    python data_test/tokenizers/make_tokenizers.py

Writes:
  wordpiece-vocab.txt          BERT WordPiece vocab (1,000 entries), for BertWordPiece{LowerCase,Case}
  sp-unigram.model             SentencePiece unigram (500 pieces, no normalizer), for (GPT)SentencePieceTokenizer
  sp-bpe.model                 SentencePiece BPE with byte fallback (500 pieces), gigatoken's fast path
  hf-bpe/tokenizer.json        byte-level BPE (600 ids) that adds a BOS, with tokenizer_config.json (eos)
  hf-wordpiece/tokenizer.json  WordPiece tokenizer.json (not a gigatoken model: the `tokenizers` path)
"""

from __future__ import annotations

import json
import os
import tempfile

import sentencepiece
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from tokenizers.implementations import BertWordPieceTokenizer

HERE = os.path.dirname(os.path.abspath(__file__))
SAMPLE = os.path.join(HERE, os.pardir, "sample_en.jsonl")
WORDPIECE_VOCAB = 1000
SENTENCEPIECE_VOCAB = 500
HF_BPE_VOCAB = 600


def sample_texts() -> list[str]:
    with open(SAMPLE, encoding="utf-8") as f:
        return [json.loads(line)["text"] for line in f]


def train_wordpiece(texts: list[str]) -> None:
    tokenizer = BertWordPieceTokenizer(lowercase=False)
    tokenizer.train_from_iterator(texts, vocab_size=WORDPIECE_VOCAB, min_frequency=2)
    tokenizer.save_model(HERE, "wordpiece")  # writes wordpiece-vocab.txt
    directory = os.path.join(HERE, "hf-wordpiece")
    os.makedirs(directory, exist_ok=True)
    tokenizer.save(os.path.join(directory, "tokenizer.json"))
    with open(os.path.join(directory, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump({"eos_token": "[SEP]", "pad_token": "[PAD]"}, f)


def train_sentencepiece(texts: list[str]) -> None:
    with tempfile.NamedTemporaryFile("w", suffix=".txt", encoding="utf-8", delete=False) as f:
        f.write("\n".join(line for text in texts for line in text.splitlines() if line.strip()))
        corpus = f.name
    try:
        # The unigram model skips normalization (keeps the file ~10 KB); the BPE one keeps the default
        # NFKC charsmap (~240 KB) so that tests check gigatoken applies it exactly as sentencepiece does.
        for model_type, name, extra in (
            ("unigram", "sp-unigram", {"normalization_rule_name": "identity"}),
            ("bpe", "sp-bpe", {"byte_fallback": True}),
        ):
            sentencepiece.SentencePieceTrainer.train(
                input=corpus, model_prefix=os.path.join(HERE, name), vocab_size=SENTENCEPIECE_VOCAB,
                model_type=model_type, character_coverage=1.0, num_threads=1, minloglevel=2, **extra,
            )
            os.remove(os.path.join(HERE, f"{name}.vocab"))
    finally:
        os.remove(corpus)


def train_hf_bpe(texts: list[str]) -> None:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=HF_BPE_VOCAB, special_tokens=["<s>", "</s>", "<pad>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(texts, trainer)
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", tokenizer.token_to_id("<s>"))]
    )
    directory = os.path.join(HERE, "hf-bpe")
    os.makedirs(directory, exist_ok=True)
    tokenizer.save(os.path.join(directory, "tokenizer.json"))
    with open(os.path.join(directory, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump({"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>"}, f)


def main() -> None:
    texts = sample_texts()
    train_wordpiece(texts)
    train_sentencepiece(texts)
    train_hf_bpe(texts)


if __name__ == "__main__":
    main()
