"""`PreprocessConfig`: everything one `preprocess-data` run needs (Megatron's flag names)."""

from __future__ import annotations

from dataclasses import dataclass


from .inputs import DEFAULT_CHUNK_BYTES
from .sentences import SUPPORTED_LANGUAGES
from .tokenizers import TokenizerConfig

TOKEN_DTYPE_RULES = ("megatron", "tight")
DATASET_IMPLS = ("mmap",)
DEFAULT_LANG = "english"


@dataclass(kw_only=True, slots=True, frozen=True)
class PreprocessConfig:
    """One preprocessing run: JSON lines in, one `.bin/.idx` pair per key out."""

    input: str
    """A JSON-lines file (.jsonl/.json, optionally .gz), a glob pattern or a directory of them."""
    output_prefix: str
    """Outputs are `{output_prefix}_{key}_document` (`_sentence` with split_sentences)."""
    tokenizer: TokenizerConfig
    """The tokenizer."""
    json_keys: tuple[str, ...] = ("text",)
    """Keys to tokenize, one output pair each."""
    append_eod: bool = False
    """Append the tokenizer's eod id to every non-empty document."""
    split_sentences: bool = False
    """One sequence per sentence (rule-based splitter, see preprocess.sentences)."""
    keep_newlines: bool = False
    """With split_sentences: keep the whitespace after a sentence inside it."""
    lang: str = DEFAULT_LANG
    """With split_sentences: the language's abbreviations."""
    workers: int = 1
    """1 = encode in this process (the tokenizer uses every core); N > 1 = N worker processes."""
    partitions: int = 1
    """Write the output as this many contiguous partial datasets, then merge them (same result)."""
    log_interval: int = 1000
    """Log progress every this many documents (when stderr is not a terminal)."""
    skip_invalid: bool = False
    """Skip (and count) invalid lines and empty files instead of failing."""
    token_dtype_rule: str = "megatron"
    """"megatron" (uint16 iff vocab_size < 65,500: byte-identical to Megatron) or "tight" (<= 65,536)."""
    dataset_impl: str = "mmap"
    """Megatron's output implementation; only "mmap" exists."""
    chunk_bytes: int = DEFAULT_CHUNK_BYTES
    """Bytes of input per task."""

    def __post_init__(self) -> None:
        if not self.json_keys or len(set(self.json_keys)) != len(self.json_keys):
            raise ValueError(f"json_keys must be non-empty and distinct, got {list(self.json_keys)}")
        for name in ("workers", "partitions", "log_interval", "chunk_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.token_dtype_rule not in TOKEN_DTYPE_RULES:
            raise ValueError(f"token_dtype_rule must be one of {TOKEN_DTYPE_RULES}, got {self.token_dtype_rule!r}")
        if self.dataset_impl not in DATASET_IMPLS:
            raise ValueError(
                f"dataset_impl {self.dataset_impl!r} is not supported: only 'mmap' (Megatron's lazy/cached "
                "formats were removed from Megatron too)"
            )
        if not self.split_sentences and (self.keep_newlines or self.lang != DEFAULT_LANG):
            raise ValueError("keep_newlines and lang only apply with split_sentences")
        if self.lang not in SUPPORTED_LANGUAGES:
            raise ValueError(f"lang {self.lang!r} is not one of {', '.join(SUPPORTED_LANGUAGES)}")

    @property
    def level(self) -> str:
        """"sentence" with split_sentences, else "document" (the output name's last part)."""
        return "sentence" if self.split_sentences else "document"

    def output_prefix_of(self, key: str) -> str:
        """The output dataset prefix for a JSON key."""
        return f"{self.output_prefix}_{key}_{self.level}"
