"""`PreprocessConfig`: everything one `preprocess-data` run needs (Megatron's flag names).

Output names, per JSON key and format (`{part}` is `_part{R}-of-{N}` when fanned out over N ranks):

    mmap        {output_prefix}{part}_{key}_{level}.bin/.idx
    arrow       {output_prefix}{part}_{key}_{level}_arrow/      (a `save_to_disk` folder)
    mindrecord  {output_prefix}{part}_{key}_{level}.mindrecord  (`.mindrecord0..` with several shards)
"""

from __future__ import annotations

from dataclasses import dataclass

from indexed_dataset.arrow import DEFAULT_SHARD_SIZE
from indexed_dataset.formats import FORMATS, dataset_path

from .inputs import DEFAULT_CHUNK_BYTES, DEFAULT_MAX_LINE_MB
from .sentences import SUPPORTED_LANGUAGES
from .tokenizers import TokenizerConfig
from .workers import DEFAULT_ENCODER_MEMORY_LIMIT_MB

TOKEN_DTYPE_RULES = ("megatron", "tight")
DATASET_IMPLS = ("mmap",)
DEFAULT_LANG = "english"


@dataclass(kw_only=True, slots=True, frozen=True)
class PreprocessConfig:
    """One preprocessing run: documents in, one dataset per JSON key and output format out."""

    input: tuple[str, ...] | str = ()
    """Input files, glob patterns and directories (see `inputs.py`); a single string is one spec."""
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
    """1 = one encoder process using every core (a small input: this process); N > 1 = N worker processes."""
    encoder_memory_limit_mb: int = DEFAULT_ENCODER_MEMORY_LIMIT_MB
    """Resident memory (MiB) past which an encoder process is replaced by a fresh one (per worker; see
    `workers.py`): bounds memory whatever the input's vocabulary, ids unchanged."""
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
    max_line_mb: int = DEFAULT_MAX_LINE_MB
    """The longest JSON line read (MiB); a longer one stops the run with its file, line and byte offset."""
    hf_dataset: str | None = None
    """Read `datasets.load_dataset(hf_dataset, streaming=True)` instead of `input` (local builders only)."""
    hf_split: str = "train"
    """The split of `hf_dataset`."""
    hf_data_files: tuple[str, ...] = ()
    """`data_files` of `hf_dataset` (for the json/parquet/arrow/text builders)."""
    output_formats: tuple[str, ...] = ("mmap",)
    """Formats written in the same pass, from the same tokens: mmap, arrow, mindrecord."""
    shard_size: int = DEFAULT_SHARD_SIZE
    """Arrow: bytes per `data-*.arrow` shard."""
    keep_fields: tuple[str, ...] = ()
    """Arrow: scalar fields of each input document copied into each row (numbers or strings)."""
    mindrecord_shards: int = 1
    """MindRecord: data files per output."""
    empty_documents: str = "write"
    """MindRecord: "write" documents without tokens as empty rows, or "reject" them."""
    rank: int = 0
    """This process's rank: it takes the rank-th contiguous block of the sorted input files."""
    world_size: int = 1
    """Processes sharing the input files; > 1 writes `_part{rank}-of-{world_size}` outputs."""
    overwrite: bool = False
    """Redo the run (or, with world_size > 1, the part) even when it is marked done."""

    def __post_init__(self) -> None:
        if isinstance(self.input, str):
            object.__setattr__(self, "input", (self.input,))
        object.__setattr__(self, "output_formats", tuple(dict.fromkeys(self.output_formats)))
        if not self.output_prefix:
            raise ValueError("output_prefix is empty")
        if bool(self.input) == (self.hf_dataset is not None):
            raise ValueError("give either input files or an hf_dataset, not both or neither")
        if self.hf_dataset is None and (self.hf_split != "train" or self.hf_data_files):
            raise ValueError("hf_split and hf_data_files apply to hf_dataset only")
        if self.hf_dataset is not None and self.world_size > 1:
            raise ValueError("fanning out over ranks splits input files; give the files with --input")
        unknown = [fmt for fmt in self.output_formats if fmt not in FORMATS]
        if unknown or not self.output_formats:
            raise ValueError(f"output formats must be among {', '.join(FORMATS)}, got {list(self.output_formats)}")
        self._check_format_options()
        if not self.json_keys or len(set(self.json_keys)) != len(self.json_keys):
            raise ValueError(f"json_keys must be non-empty and distinct, got {list(self.json_keys)}")
        for name in ("workers", "encoder_memory_limit_mb", "partitions", "log_interval", "chunk_bytes", "max_line_mb"):
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
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank must lie in [0, world_size), got rank {self.rank}, world_size {self.world_size}")

    def _check_format_options(self) -> None:
        """An option of a format that is not written would be silently ignored: refuse it. (The writers
        check the values themselves when the run opens them, before any tokenizing.)"""
        if "arrow" not in self.output_formats and (self.keep_fields or self.shard_size != DEFAULT_SHARD_SIZE):
            raise ValueError("keep_fields and shard_size apply to the arrow output format only")
        if "mindrecord" not in self.output_formats and (self.mindrecord_shards != 1 or self.empty_documents != "write"):
            raise ValueError("mindrecord_shards and empty_documents apply to the mindrecord output format only")
        if self.shard_size < 1:
            raise ValueError(f"shard_size must be >= 1, got {self.shard_size}")
        clash = set(self.keep_fields) & set(self.json_keys)
        if clash or len(set(self.keep_fields)) != len(self.keep_fields):
            raise ValueError(f"keep_fields must be distinct and not json keys, got {list(self.keep_fields)}")

    @property
    def level(self) -> str:
        """"sentence" with split_sentences, else "document" (the output name's last part)."""
        return "sentence" if self.split_sentences else "document"

    @property
    def part_prefix(self) -> str:
        """`output_prefix`, with `_part{rank}-of-{world_size}` when fanned out (rank zero-padded to the
        width of world_size, so that a directory's lexicographic order is the rank order)."""
        if self.world_size == 1:
            return self.output_prefix
        return f"{self.output_prefix}_part{self.rank:0{len(str(self.world_size))}d}-of-{self.world_size}"

    def output_prefix_of(self, key: str) -> str:
        """The mmap output dataset prefix for a JSON key."""
        return f"{self.part_prefix}_{key}_{self.level}"

    def output_paths_of(self, key: str) -> dict[str, str]:
        """Format -> output path of a JSON key, for every output format."""
        return {fmt: dataset_path(fmt, self.output_prefix_of(key)) for fmt in self.output_formats}
