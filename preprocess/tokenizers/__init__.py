"""Tokenizers behind one small contract, one adapter per Megatron `--tokenizer-type`.

    from preprocess.tokenizers import TokenizerConfig, build_tokenizer
    tok = build_tokenizer(TokenizerConfig(tokenizer_type="GPT2BPETokenizer",
                                          vocab_file="gpt2-vocab.json", merge_file="gpt2-merges.txt"))
    tok.encode("Hello") -> [15496]; tok.decode([15496]) -> "Hello"; tok.vocab_size -> 50257; tok.eod -> 50256

Every file is local; nothing is downloaded.
"""

from __future__ import annotations

from ..errors import TokenizerError
from .base import RaggedTokens, Tokenizer
from .config import TOKENIZER_TYPES, TokenizerConfig


def build_tokenizer(config: TokenizerConfig) -> Tokenizer:
    """The tokenizer `config` describes.

    Raises:
        TokenizerError: a file is missing or unreadable.
    """
    kind = config.tokenizer_type
    # Imports are local so that a process only loads the libraries of the tokenizer it builds.
    if kind == "GPT2BPETokenizer":
        from .gpt2 import build_gpt2_tokenizer

        return build_gpt2_tokenizer(config.vocab_file, config.merge_file)
    if kind in ("BertWordPieceLowerCase", "BertWordPieceCase"):
        from .wordpiece import WordPieceTokenizer

        wordpiece = WordPieceTokenizer(config.vocab_file, lower_case=kind == "BertWordPieceLowerCase",
                                       add_special_tokens=config.tokenizer_bert_include_special_tokens)
        if not config.chinese_wwm:
            return wordpiece
        from .chinese_wwm import ChineseWholeWordTokenizer

        return ChineseWholeWordTokenizer(wordpiece)
    if kind in ("SentencePieceTokenizer", "GPTSentencePieceTokenizer", "Llama2Tokenizer"):
        from .sentencepiece import build_sentencepiece_tokenizer

        return build_sentencepiece_tokenizer(config.tokenizer_model, megatron_specials=kind == "SentencePieceTokenizer",
                                             bos=kind == "Llama2Tokenizer")
    if kind == "HuggingFaceTokenizer":
        from .huggingface import build_huggingface_tokenizer

        return build_huggingface_tokenizer(config.tokenizer_model, config.tokenizer_hf_include_special_tokens)
    from .null import NullTokenizer

    return NullTokenizer(config.vocab_size)


__all__ = ["TOKENIZER_TYPES", "RaggedTokens", "Tokenizer", "TokenizerConfig", "TokenizerError", "build_tokenizer"]
