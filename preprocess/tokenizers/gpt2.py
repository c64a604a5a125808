"""Megatron's GPT2BPETokenizer: GPT-2 byte-level BPE from `vocab.json` + `merges.txt`.

Megatron builds transformers' GPT2TokenizerFast from the two files; we build the same BPE model with
Hugging Face `tokenizers` (no prefix space, `<|endoftext|>` as a special token) and encode with
gigatoken, whose ids equal GPT2TokenizerFast's (tests compare them on hard text).
"""

from __future__ import annotations

import json

import gigatoken
import numpy as np
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
        TokenizerError: a file is missing or unreadable, or the vocabulary lacks `<|endoftext|>`, or its ids
            are not 0..N-1 once each.
    """
    require_file(vocab_file, "GPT-2 vocab file")
    require_file(merge_file, "GPT-2 merge file")
    check_gpt2_vocab(vocab_file)
    try:
        reference = HFTokenizer(BPE.from_file(vocab_file, merge_file))
    except Exception as error:  # tokenizers raises a bare Exception for malformed files
        raise TokenizerError(f"{vocab_file}, {merge_file}: cannot read GPT-2 BPE files: {error}") from None
    reference.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    reference.decoder = decoders.ByteLevel()
    reference.add_special_tokens([AddedToken(END_OF_TEXT, special=True, normalized=False)])
    eod = reference.token_to_id(END_OF_TEXT)
    tokenizer = GigatokenTokenizer(gigatoken.Tokenizer(reference), reference.get_vocab_size(), eod)
    tokenizer.special_tokens = {END_OF_TEXT: eod}
    return tokenizer


def check_gpt2_vocab(vocab_file: str) -> None:
    """Check that a GPT-2 vocab.json maps tokens to the ids 0..N-1, each once, and holds `<|endoftext|>`.

    The BPE libraries trust the ids: a repeated id fails deep in gigatoken ("Byte remapping failed"), a huge
    one makes it allocate a table that large, and a missing `<|endoftext|>` would be added after the
    vocabulary, an eod id no GPT-2 model has.

    Raises:
        TokenizerError: one line naming the file and the first token at fault.
    """
    try:
        with open(vocab_file, encoding="utf-8") as f:
            vocab = json.load(f)
    except (OSError, ValueError) as error:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise TokenizerError(f"{vocab_file}: cannot read the GPT-2 vocab: {error}") from None
    if not isinstance(vocab, dict) or not vocab:
        raise TokenizerError(f"{vocab_file}: a GPT-2 vocab is a non-empty JSON object of token -> id")
    tokens = list(vocab)
    for token in tokens:
        if type(vocab[token]) is not int:  # noqa: E721 (bool is an int subclass, and not an id)
            raise TokenizerError(f"{vocab_file}: token {token!r} has id {vocab[token]!r}, not an integer")
    ids = np.array([vocab[token] if 0 <= vocab[token] < len(tokens) else -1 for token in tokens], dtype=np.int64)
    if (ids < 0).any():
        token = tokens[int(np.argmax(ids < 0))]
        raise TokenizerError(f"{vocab_file}: token {token!r} has id {vocab[token]}; the ids of a vocab of "
                             f"{len(tokens)} tokens must be 0..{len(tokens) - 1}")
    order = np.argsort(ids, kind="stable")  # stable: the tokens of one id stay in file order
    repeated = np.flatnonzero(ids[order][1:] == ids[order][:-1])
    if len(repeated):
        first, second = int(order[repeated[0]]), int(order[repeated[0] + 1])
        raise TokenizerError(f"{vocab_file}: tokens {tokens[first]!r} and {tokens[second]!r} both have id "
                             f"{ids[second]}; each id must be used once")
    if END_OF_TEXT not in vocab:
        raise TokenizerError(f"{vocab_file}: vocabulary has no {END_OF_TEXT} token")
