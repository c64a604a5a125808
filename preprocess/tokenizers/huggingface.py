"""Megatron's HuggingFaceTokenizer, from a local `tokenizer.json` (or a directory holding one).

Like Megatron (`tokenizer(text).input_ids`), the tokenizer's own special tokens (a BOS, say) are
added unless `include_special_tokens` is off. eod is the `eos_token` of a `tokenizer_config.json` or
`special_tokens_map.json` next to the tokenizer.json, else the tokenizer.json's own special
end-of-document token (`<|endoftext|>`, `</s>`, ... in its `added_tokens`); an eod that differs from
the `eos_token_id` of a model's `config.json` beside them is logged as a warning. When gigatoken can load the tokenizer and gives
the same ids on the probe texts, it does the encoding; otherwise Hugging Face `tokenizers` does.
Nothing is ever fetched from the Hub.
"""

from __future__ import annotations

import json
import logging
import os

import gigatoken
import numpy as np
import pyarrow as pa
from tokenizers import Tokenizer as HFTokenizer

from ..errors import TokenizerError
from .base import RaggedTokens, Tokenizer
from .files import require_file
from .giga import GigatokenTokenizer, matches_reference
from .wordpiece import added_special_tokens, encode_batch_hf

logger = logging.getLogger(__name__)

TOKENIZER_JSON = "tokenizer.json"
MODEL_CONFIG_JSON = "config.json"
_CONFIG_FILES = ("tokenizer_config.json", "special_tokens_map.json")
# The spellings of an end-of-document token, in the order they are looked for among a tokenizer.json's
# special added tokens when no config file names an eos_token (GPT-2/GPT-NeoX, T5/Llama-2, Llama-3, Gemma).
EOD_TOKENS = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>")
# A text whose ids reveal the special tokens a post-processor puts around every text.
_SPECIALS_PROBE = "a"


def _named_token(directory: str, name: str) -> str | None:
    """The content of a named special token (e.g. "eos_token") from the config files, if any.

    Raises:
        TokenizerError: a config file names it with something other than a string (or a dict holding one).
    """
    for config in _CONFIG_FILES:
        path = os.path.join(directory, config)
        if not os.path.isfile(path):
            continue
        try:
            with open(path, encoding="utf-8") as f:
                value = json.load(f).get(name)
        except (OSError, ValueError, AttributeError) as error:
            raise TokenizerError(f"{path}: cannot read: {error}") from None
        # A dict is an AddedToken written out: {"content": "</s>", "special": true, ...}.
        content = value.get("content") if isinstance(value, dict) else value
        if isinstance(content, str):
            return content
        if value is not None:
            raise TokenizerError(f"{path}: {name} must be a token string or {{\"content\": string}}, "
                                 f"got {value!r}")
    return None


def _special_eod(path: str) -> str | None:
    """The first of EOD_TOKENS among the special `added_tokens` of a tokenizer.json, if any."""
    try:
        with open(path, encoding="utf-8") as f:
            added = json.load(f).get("added_tokens") or []
    except (OSError, ValueError, AttributeError) as error:
        raise TokenizerError(f"{path}: cannot read: {error}") from None
    special = {entry.get("content") for entry in added if isinstance(entry, dict) and entry.get("special")}
    return next((token for token in EOD_TOKENS if token in special), None)


def _check_model_eos(directory: str, eod: int) -> None:
    """Warn when a model's config.json beside the tokenizer names another eos_token_id than our eod."""
    path = os.path.join(directory, MODEL_CONFIG_JSON)
    if not os.path.isfile(path):
        return
    try:
        with open(path, encoding="utf-8") as f:
            expected = json.load(f).get("eos_token_id")
    except (OSError, ValueError, AttributeError):
        return  # a model config is not ours to validate; the tokenizer does not depend on it
    ids = expected if isinstance(expected, list) else [expected]
    if expected is not None and eod not in ids:
        logger.warning("%s: eos_token_id %s differs from the tokenizer's end-of-document id %d (used by "
                       "--append-eod)", path, expected, eod)


def _special_affixes(reference: HFTokenizer) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """(prefix, suffix) ids the post-processor adds around a single text, or None if not that shape."""
    plain = reference.encode(_SPECIALS_PROBE, add_special_tokens=False).ids
    full = reference.encode(_SPECIALS_PROBE).ids
    for start in range(len(full) - len(plain) + 1):
        if full[start : start + len(plain)] == plain:
            return tuple(full[:start]), tuple(full[start + len(plain) :])
    return None


class HFTokenizersTokenizer(Tokenizer):
    """Any tokenizer.json through Hugging Face `tokenizers`."""

    def __init__(self, backend: HFTokenizer, eod: int | None, pad: int | None, add_special_tokens: bool) -> None:
        self.backend = backend
        self.vocab_size = backend.get_vocab_size(with_added_tokens=True)
        self._eod = eod
        self.pad = pad
        self.add_special_tokens = add_special_tokens
        self.special_tokens = added_special_tokens(backend)
        affixes = _special_affixes(backend) if add_special_tokens else ((), ())
        # A post-processor that does more than wrap the text: pieces keep it (`encode_plain` = `encode`).
        self._plain = affixes is not None or not add_special_tokens
        self.affixes = affixes or ((), ())

    def encode(self, text: str) -> list[int]:
        return self.backend.encode(text, add_special_tokens=self.add_special_tokens).ids

    def encode_plain(self, text: str) -> list[int]:
        return self.backend.encode(text, add_special_tokens=not self._plain and self.add_special_tokens).ids

    def decode(self, ids) -> str:
        # Special tokens stay in the text, as in transformers' decode (and gigatoken's).
        return self.backend.decode(np.asarray(ids).tolist(), skip_special_tokens=False)

    def encode_batch(self, texts: pa.Array | list[str]) -> RaggedTokens:
        return encode_batch_hf(self.backend, texts, self.add_special_tokens)


def build_huggingface_tokenizer(tokenizer_model: str, include_special_tokens: bool = True) -> Tokenizer:
    """A HuggingFaceTokenizer from a local tokenizer.json or a directory holding one.

    Raises:
        TokenizerError: no such file, or it cannot be parsed.
    """
    path = os.path.join(tokenizer_model, TOKENIZER_JSON) if os.path.isdir(tokenizer_model) else tokenizer_model
    require_file(path, "Hugging Face tokenizer.json (local files only, nothing is downloaded)")
    try:
        reference = HFTokenizer.from_file(path)
    except Exception as error:  # tokenizers raises a bare Exception for malformed files
        raise TokenizerError(f"{path}: cannot read tokenizer.json: {error}") from None
    directory = os.path.dirname(os.path.abspath(path))
    eod_token = _named_token(directory, "eos_token") or _special_eod(path)
    eod, pad = (
        reference.token_to_id(token) if token else None
        for token in (eod_token, _named_token(directory, "pad_token"))
    )
    if eod is not None:
        _check_model_eos(directory, eod)
    fallback = HFTokenizersTokenizer(reference, eod, pad, include_special_tokens)
    fallback.eod_missing = _eod_missing(path, directory, eod_token)
    affixes = _special_affixes(reference) if include_special_tokens else ((), ())
    if affixes is None:
        return fallback
    try:
        with open(path, "rb") as f:
            backend = gigatoken.Tokenizer.from_json(f.read())
    except Exception:  # gigatoken raises RuntimeError/ValueError for models it does not implement
        return fallback
    fast = GigatokenTokenizer(backend, fallback.vocab_size, eod, pad, *affixes)
    fast.eod_missing, fast.special_tokens = fallback.eod_missing, fallback.special_tokens
    plain = lambda text: reference.encode(text, add_special_tokens=False).ids  # noqa: E731
    return fast if matches_reference(backend, plain) else fallback


def _eod_missing(path: str, directory: str, eod_token: str | None) -> str:
    """The one line `--append-eod` gives when the tokenizer has no end-of-document id."""
    if eod_token is not None:
        return f"{path}: the eos_token {eod_token!r} is not in the tokenizer's vocabulary"
    return (f"{path}: no end-of-document token for --append-eod: give \"eos_token\" in "
            f"{os.path.join(directory, _CONFIG_FILES[0])}, or add one of {', '.join(EOD_TOKENS)} as a special "
            "token to the tokenizer.json's added_tokens")
