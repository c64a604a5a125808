"""Megatron's GPT2BPETokenizer: GPT-2 byte-level BPE from `vocab.json` + `merges.txt`.

Megatron builds transformers' GPT2TokenizerFast from the two files; we build the same BPE model with
Hugging Face `tokenizers` (no prefix space, `<|endoftext|>` as a special token) and encode with
gigatoken, whose ids equal GPT2TokenizerFast's (tests compare them on hard text).
"""

from __future__ import annotations

import gigatoken
from tokenizers import AddedToken
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, pre_tokenizers
from tokenizers.models import BPE

from ..errors import TokenizerError
from .files import require_file
from .giga import GigatokenTokenizer

END_OF_TEXT = "<|endoftext|>"


def build_gpt2_tokenizer(vocab_file: str, merge_file: str) -> GigatokenTokenizer:
    """GPT-2 BPE; vocab_size = number of vocab entries (50,257 for GPT-2), eod = `<|endoftext|>`.

    Raises:
        TokenizerError: a file is missing or unreadable, or the vocabulary lacks `<|endoftext|>`.
    """
    require_file(vocab_file, "GPT-2 vocab file")
    require_file(merge_file, "GPT-2 merge file")
    try:
        reference = HFTokenizer(BPE.from_file(vocab_file, merge_file))
    except Exception as error:  # tokenizers raises a bare Exception for malformed files
        raise TokenizerError(f"{vocab_file}, {merge_file}: cannot read GPT-2 BPE files: {error}") from None
    reference.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    reference.decoder = decoders.ByteLevel()
    reference.add_special_tokens([AddedToken(END_OF_TEXT, special=True, normalized=False)])
    eod = reference.token_to_id(END_OF_TEXT)
    if eod is None:
        raise TokenizerError(f"{vocab_file}: vocabulary has no {END_OF_TEXT} token")
    tokenizer = GigatokenTokenizer(gigatoken.Tokenizer(reference), reference.get_vocab_size(), eod)
    tokenizer.special_tokens = {END_OF_TEXT: eod}
    return tokenizer
