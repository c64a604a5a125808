"""`TrainConfig`: every setting of a training run, one sub-dataclass per concern.

Field names follow Megatron-LM's flags (``num_layers`` is ``--num-layers``). Each field carries a
one-line docstring; `trainer.cli.train_args` turns the fields and their docstrings into the ``train`` flags.
Every numeric field declares its valid `Range` (``flag(..., valid=...)``), which ``--help`` prints and
`check_ranges` enforces. Checks that need only one section live in that section's ``__post_init__``;
checks across sections in `TrainConfig.__post_init__`, those that depend on the family in
`trainer.family.checks`, and those that need the world size in `trainer.parallel.dims.ParallelDims`. A family's
own settings are its section in `TrainConfig.families` (declared in its folder, `trainer.models.<family>`).

Example:
    >>> cfg = TrainConfig(model=ModelConfig(num_layers=2, hidden_size=64, num_attention_heads=4,
    ...                                     seq_length=32, vocab_size=1000),
    ...                   data=DataConfig(dataset=["data/my_text_document"]),
    ...                   training=TrainingConfig(micro_batch_size=4, global_batch_size=8,
    ...                                           train_iters=10, device="cpu"))
"""

from __future__ import annotations

import importlib.util
import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import Field, dataclass, field, fields
from typing import Any

from indexed_dataset.cli_parser import SEED_MAX
from samplers.errors import BlendFormatError, SplitFormatError
from samplers.mock import MOCK_SPLIT
from samplers.run_length import DEFAULT_EVAL_INTERVAL, DEFAULT_EVAL_ITERS
from samplers.splits import DEFAULT_SPLIT, SPLIT_NAMES, parse_blend, parse_split
from trainer.errors import ModelFileError, TrainConfigError
from trainer.optim.batch_size_schedule import (
    BatchSizeSchedule,
    RampupBatchSize,
    parse_step_batch_size_schedule,
    train_iters_for_samples,
)
from trainer.optim.lr_schedule import LR_DECAY_STYLES, LR_WSD_DECAY_STYLES, WD_INCR_STYLES, ParamScheduler, count_text
from trainer.moe.router import LOAD_BALANCING_TYPES, ROUTER_DTYPES
from trainer.parallel.attention_backend import ATTENTION_BACKENDS
from trainer.parallel.recompute import RECOMPUTE_GRANULARITIES, RECOMPUTE_METHODS, Recompute

# The `TrainConfig` field that holds the families' own sections (by name) in place of a section of its own.
FAMILIES_FIELD = "families"
# Megatron's default: the loss scale starts at 2**32 and halves on every overflow until it fits.
DEFAULT_INITIAL_LOSS_SCALE = 2.0**32
# Steps of a run that gives neither train_iters nor train_samples.
DEFAULT_TRAIN_ITERS = 100
# Megatron's --make-vocab-size-divisible-by default.
DEFAULT_DIVISIBLE_BY = 128
# Megatron's --normalization and --position-embedding-type choices that the GPT decoder implements.
NORMALIZATIONS = ("LayerNorm", "RMSNorm")
POSITION_EMBEDDING_TYPES = ("learned_absolute", "rope", "none")
# Megatron's validate_args: a SwiGLU MLP without --ffn-hidden-size is 2/3 of the 4 x hidden GELU MLP (two
# input projections instead of one keep the parameter count), rounded down to a multiple of 64.
SWIGLU_FFN_MULTIPLE = 64
# The `ModelConfig` fields of the decoder's Llama-class options (a family without them lists them unused).
DECODER_OPTION_FIELDS = ("normalization", "apply_layernorm_1p", "swiglu", "position_embedding_type",
                         "no_position_embedding", "rotary_base", "rotary_percent",
                         "rotary_seq_len_interpolation_factor", "use_rope_scaling", "rope_scaling_factor",
                         "group_query_attention", "num_query_groups", "disable_bias_linear",
                         "add_qkv_bias", "qk_layernorm")
# Megatron's GPT data flags that follow the documents inside a sample (the samplers' GPTDatasetConfig fields of
# the same names); the other families' samples have their own document structure.
DOCUMENT_FIELDS = ("reset_position_ids", "reset_attention_mask", "eod_mask_loss")


@dataclass(frozen=True, slots=True)
class Range:
    """The valid values of a numeric field: ``low`` to ``high`` (None: unbounded on that side), each end
    included unless ``*_open``. Checked by `check_ranges` before anything starts, shown in ``--help``."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False

    def __contains__(self, value: float) -> bool:
        above = self.low is None or (value > self.low if self.low_open else value >= self.low)
        below = self.high is None or (value < self.high if self.high_open else value <= self.high)
        return above and below

    def __str__(self) -> str:
        low, high = _number(self.low), _number(self.high)
        if self.high is None:
            return f"{'>' if self.low_open else '>='} {low}"
        if self.low is None:
            return f"{'<' if self.high_open else '<='} {high}"
        return f"in {'(' if self.low_open else '['}{low}, {high}{')' if self.high_open else ']'}"


def _number(value: float | None) -> str:
    """``1`` for 1.0, ``4294967295`` for 2**32 - 1 (never 4.29497e+09), ``0.5`` for 0.5."""
    return str(int(value)) if value is not None and float(value).is_integer() else str(value)


# Megatron's fp8 choices (TransformerConfig), so that its scripts reach the one-line fp8 refusal.
FP8_FORMATS = ("e4m3", "hybrid")
FP8_RECIPES = ("tensorwise", "delayed", "mxfp8", "blockwise", "custom")
FP8_AMAX_COMPUTE_ALGOS = ("most_recent", "max")
AT_LEAST_ONE = Range(1)
POSITIVE = Range(0, low_open=True)
NON_NEGATIVE = Range(0)
PROBABILITY = Range(0, 1, high_open=True)
"""Dropouts and Adam's betas: 1 would drop everything / never forget."""
FRACTION = Range(0, 1)
SEED_RANGE = Range(0, SEED_MAX)
# 0 = any free port (single node only, checked in LaunchConfig).
PORT_RANGE = Range(0, 65535)
# The signals --exit-signal-handler may catch (Megatron's --exit-signal takes any signal name; these are the ones
# a scheduler or a user sends to ask a run to leave).
EXIT_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP", "SIGUSR1", "SIGUSR2")
# Seconds a node waits at start-up for the others: Megatron's --distributed-timeout-minutes default.
DEFAULT_DIST_TIMEOUT_S = 600
# Minutes a collective waits for the other ranks before the run ends: Megatron's --distributed-timeout-minutes
# default.
DEFAULT_DISTRIBUTED_TIMEOUT_MINUTES = 10.0


def flag(default: Any = None, *aliases: str, choices: tuple[str, ...] | None = None, nargs: str | None = None,
         valid: Range | None = None, env: tuple[str, ...] = (),
         grammar: Callable[[Any], str | None] | None = None, same_math: str | None = None) -> Any:
    """A dataclass field with extra command-line spellings (``--lr`` also as ``--learning-rate``), its valid
    range (numbers), the environment variables that give the ``train`` flag's default (first set wins), and
    the check of a string value's grammar (returns the problem, or None; its section runs it too).

    ``same_math``: the field is a Megatron switch accepted so that Megatron's scripts run, whose every value
    computes what this trainer computes anyway; the text says why (``--help`` prints it). Nothing reads
    such a field."""
    metadata = {"aliases": aliases, "choices": choices, "nargs": nargs, "valid": valid, "env": env, "grammar": grammar,
                "same_math": same_math}
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=metadata)
    return field(default=default, metadata=metadata)


def check_ranges(section: object) -> None:
    """Check every field of ``section``: a float is finite, a value is within its declared valid `Range` and
    among its declared choices (what the flags check, for configs built in Python or by other commands).

    Raises:
        TrainConfigError: the first value that is not, naming the field.
    """
    for f in fields(section):
        problem = _field_problem(f, getattr(section, f.name))
        if problem is not None:
            raise TrainConfigError(f"`{f.name}` {problem}")


def _field_problem(f: Field, value: Any) -> str | None:
    """What is wrong with ``value`` (of the field's type; a list: each of its items) for field ``f`` on its own,
    or None."""
    if isinstance(value, list):
        return next((problem for item in value if (problem := _field_problem(f, item)) is not None), None)
    valid, choices = f.metadata.get("valid"), f.metadata.get("choices")
    if isinstance(value, float) and not math.isfinite(value):
        return f"must be a finite number, got {value}"
    if valid is not None and value is not None and value not in valid:
        return f"must be {valid}, got {value}"
    if choices is not None and value is not None and value not in choices:
        return f"must be one of {', '.join(choices)}, got {value!r}"
    return None


def train_field_problem(name: str, value: Any, family_sections: Iterable[type] = ()) -> str | None:
    """What is wrong with ``value`` (already of the field's type) for the `TrainConfig` field ``name`` on its
    own (its range, choices and grammar): for a value a file gives, which the command line may override.
    ``family_sections``: the families' own section classes (`TrainConfig.families`), which the registry gives."""
    core = [section.default_factory for section in fields(TrainConfig) if section.name != FAMILIES_FIELD]
    for section in (*core, *family_sections):
        for f in fields(section):
            if f.name == name:
                grammar = f.metadata.get("grammar")
                return _field_problem(f, value) or (grammar(value) if grammar and value is not None else None)
    return None


def split_problem(split: str) -> str | None:
    """What is wrong with a ``split`` string ("969,30,1"), or None."""
    # Megatron reads the numbers with [.0-9]+, so "-1,50,51" would silently mean 1,50,51.
    if re.search(r"-\s*[.0-9]", split):
        return f"`split` entries must be >= 0 with a positive sum, got {split!r}"
    try:
        parse_split(split)
    except SplitFormatError as error:
        return str(error)
    return None


def check_file_values(values: Mapping[str, Any], section: type, source: str, prefix: str = "",
                      spellings: Mapping[str, str] | None = None) -> None:
    """Check the values a file gives (a checkpoint's model_config.json, a HF config.json) against the type
    and valid `Range` that ``section``'s field of the same meaning declares: the checks the flags get,
    reported as the file's key (``run/model_config.json: shape.num_layers=-2: must be >= 1``), not as a flag
    the user never typed.

    Args:
        values: key -> value as read from the file.
        section: the config dataclass whose fields declare the types and ranges (`ModelConfig`, `MoEConfig`).
        source: the file, first in every message.
        prefix: where the keys sit in the file (``"shape."``).
        spellings: file key -> field name where they differ (GPT-2's ``n_embd`` -> ``hidden_size``); a key
            that is neither a field nor spelled here is left to the caller.

    Raises:
        ModelFileError: the first value of the wrong type or outside its range.
    """
    declared = {f.name: f for f in fields(section)}
    for key, value in values.items():
        declared_field = declared.get((spellings or {}).get(key, key))
        problem = None if declared_field is None else _value_problem(value, declared_field)
        if problem is not None:
            raise ModelFileError(f"{source}: {prefix}{key}={value!r}: {problem}")


def _value_problem(value: Any, f: Field) -> str | None:
    """What is wrong with a file's ``value`` for field ``f``: its type (annotated ``"int | None"``, say; a file,
    unlike a flag, can hold any JSON type), then what `_field_problem` checks; None when nothing is."""
    annotation = str(f.type)
    if value is None:
        return None if "None" in annotation else "must be given"
    if annotation.startswith("bool"):
        return None if isinstance(value, bool) else "must be true or false"
    if annotation.startswith("int") and (isinstance(value, bool) or not isinstance(value, int)):
        return "must be an integer"
    if annotation.startswith("float") and (isinstance(value, bool) or not isinstance(value, (int, float))):
        return "must be a number"
    if annotation.startswith("str") and not isinstance(value, str):
        return "must be a string"
    return _field_problem(f, value)


@dataclass(kw_only=True, slots=True)
class ModelConfig:
    """Model kind and shape (T5 adds the t5 section)."""

    model: str = "gpt"
    """Model kind: gpt (decoder only), t5 (encoder-decoder, span corruption on sentence-split data) or bert
    (encoder, masked LM + sentence order on sentence-split WordPiece data)."""
    num_layers: int = flag(12, valid=AT_LEAST_ONE)
    """Number of transformer blocks (T5: encoder blocks)."""
    hidden_size: int = flag(768, valid=AT_LEAST_ONE)
    """Width of the residual stream."""
    num_attention_heads: int = flag(12, valid=AT_LEAST_ONE)
    """Attention heads per block (hidden_size must divide by it)."""
    ffn_hidden_size: int | None = flag(None, "--ff-hidden-size", valid=AT_LEAST_ONE)
    """Width of the MLP; default 4 x hidden_size."""
    seq_length: int = flag(1024, valid=AT_LEAST_ONE)
    """Tokens per training sample."""
    max_position_embeddings: int | None = flag(None, valid=AT_LEAST_ONE)
    """Rows of the learned position table (gpt, bert), at least seq_length; default seq_length. T5 (relative
    positions, no table) checks it as Megatron does: at least encoder_seq_length and decoder_seq_length."""
    vocab_size: int | None = flag(None, valid=AT_LEAST_ONE)
    """Vocabulary size before padding; default the tokenizer's."""
    make_vocab_size_divisible_by: int = flag(DEFAULT_DIVISIBLE_BY, valid=AT_LEAST_ONE)
    """Pad the vocabulary to a multiple of this times the tensor-parallel size (Megatron)."""
    hidden_dropout: float = flag(0.1, valid=PROBABILITY)
    """Dropout after attention and MLP and on the embeddings."""
    attention_dropout: float = flag(0.1, valid=PROBABILITY)
    """Dropout on the attention probabilities."""
    init_method_std: float = flag(0.02, valid=POSITIVE)
    """Standard deviation of the normal weight init (output projections get std/sqrt(2*layers))."""
    use_cpu_initialization: bool = False
    """Megatron's: draw the initial weights from the CPU's random generator and copy them to the device, so a run
    starts from the same weights on a GPU as on the CPU (by default they are drawn on the device, faster; the
    seed gives the same weights in every parallel layout either way)."""
    layernorm_epsilon: float = flag(1e-5, "--norm-epsilon", valid=POSITIVE)
    """Epsilon of the LayerNorm / RMSNorm (0 or less divides by zero: NaN loss)."""
    fused_qkv: bool = flag(False, "--multihead-attention-fusion")
    """GPT: compute q, k and v with one linear, rows per query group (checkpoints keep q, k, v apart)."""
    normalization: str = flag("LayerNorm", choices=NORMALIZATIONS)
    """GPT: the norm of every block, of q/k (qk_layernorm) and before the head: LayerNorm or RMSNorm (Llama)."""
    apply_layernorm_1p: bool = False
    """GPT: norm weights stored zero-centred (initialised to 0, scale 1 + weight), as Megatron's Llama 3 example."""
    swiglu: bool = False
    """GPT: SwiGLU MLP w2(silu(w1 x) * w3 x) instead of GELU; default ffn_hidden_size int(8 h / 3 / 64) * 64."""
    position_embedding_type: str = flag("learned_absolute", choices=POSITION_EMBEDDING_TYPES)
    """GPT: learned_absolute (GPT-2's table), rope (rotary q/k, no table) or none."""
    no_position_embedding: bool = False
    """GPT: Megatron's deprecated switch for no learned table: accepted with position_embedding_type rope only."""
    rotary_base: int = flag(10000, valid=AT_LEAST_ONE)
    """GPT rope: base of the rotary frequencies (Llama 2: 10000, Llama 3: 500000)."""
    rotary_percent: float = flag(1.0, valid=Range(0, 1, low_open=True))
    """GPT rope: fraction of each head's channels rotated (the rest pass through)."""
    rotary_seq_len_interpolation_factor: int | None = flag(None, valid=AT_LEAST_ONE)
    """GPT rope: linear position interpolation, rotary positions divided by this factor."""
    use_rope_scaling: bool = False
    """GPT rope: Llama 3.1's frequency scaling (low frequencies divided by rope_scaling_factor, smooth between)."""
    rope_scaling_factor: float = flag(8.0, valid=POSITIVE)
    """GPT rope with use_rope_scaling: the factor of Llama 3.1's frequency scaling."""
    group_query_attention: bool = False
    """GPT: grouped-query attention, num_query_groups key/value heads shared by the query heads."""
    num_query_groups: int | None = flag(None, valid=AT_LEAST_ONE)
    """GPT with group_query_attention: key/value heads (1: multi-query); default 1 (Megatron's)."""
    disable_bias_linear: bool = False
    """GPT: no biases in the attention and MLP linears (Llama)."""
    add_qkv_bias: bool = False
    """GPT: biases on q, k and v even with disable_bias_linear (Qwen2)."""
    qk_layernorm: bool = False
    """GPT: normalize q and k per head (the model's normalization) before rotary embedding (Qwen3)."""
    kv_channels: int | None = flag(None, "--kv-hidden-size", valid=AT_LEAST_ONE)
    """Channels per attention head (T5's d_kv, a GPT's head dim (Megatron's Llama 3 example); CPM-Pretrain:
    --kv-hidden-size); default hidden_size / num_attention_heads."""
    untie_embeddings_and_output_weights: bool = False
    """Separate LM head (T5 v1.1, mT5, a GPT such as Llama); tied T5 heads scale the decoder output by
    hidden_size**-0.5 (v1.0)."""

    def __post_init__(self) -> None:
        # Whether the family computes q, k and v fused is the family's (`trainer.family.checks`).
        check_ranges(self)
        self._check_decoder_options()
        if self.hidden_size % self.num_attention_heads:
            raise TrainConfigError(f"hidden_size ({self.hidden_size}) is not divisible by "
                                   f"num_attention_heads ({self.num_attention_heads})")
        if self.ffn_hidden_size is None:
            self.ffn_hidden_size = (int(4 * self.hidden_size * 2 / 3 / SWIGLU_FFN_MULTIPLE) * SWIGLU_FFN_MULTIPLE
                                    if self.swiglu else 4 * self.hidden_size)
        # max_position_embeddings stays None when not given: what it must cover is the family's (its
        # layout_rules check it), and T5's lengths are not seq_length.

    def positions(self) -> int:
        """Rows of a learned position table: max_position_embeddings, default seq_length."""
        return self.max_position_embeddings or self.seq_length

    def _check_decoder_options(self) -> None:
        """The GPT decoder options that depend on each other (Megatron's validate_args rules)."""
        if self.no_position_embedding and self.position_embedding_type != "rope":
            # Megatron: "--no-position-embedding is deprecated, use --position-embedding-type".
            raise TrainConfigError("no_position_embedding is deprecated: use position_embedding_type none (or rope)")
        if self.num_query_groups is not None and not self.group_query_attention:
            raise TrainConfigError(f"num_query_groups ({self.num_query_groups}) needs group_query_attention")
        groups = self.query_groups()
        if self.num_attention_heads % groups:
            raise TrainConfigError(f"num_attention_heads ({self.num_attention_heads}) is not divisible by "
                                   f"num_query_groups ({groups})")

    def query_groups(self) -> int:
        """Key/value heads: num_query_groups (default 1) with group_query_attention, else one per query head."""
        if not self.group_query_attention:
            return self.num_attention_heads
        return self.num_query_groups or 1


@dataclass(kw_only=True, slots=True)
class DataConfig:
    """Where the tokens come from and how they are split."""

    dataset: list[str] = flag([], nargs="+")
    """Dataset prefix(es) (PREFIX.bin/PREFIX.idx), equal weights (OneFlow spelling)."""
    data_path: list[str] = flag([], nargs="+")
    """Megatron blend: [W1] P1 [W2 P2 ...] (weights optional)."""
    train_data_path: list[str] | None = flag(None, nargs="+")
    """Blend of the train split alone, [W1] P1 [W2 P2 ...], used whole (excludes --data-path, --dataset, --split)."""
    valid_data_path: list[str] | None = flag(None, nargs="+")
    """Blend of the valid split alone, used whole (none: no validation)."""
    test_data_path: list[str] | None = flag(None, nargs="+")
    """Blend of the test split alone, used whole (none: no test evaluation)."""
    split: str | None = flag(None, grammar=split_problem)
    """Train,valid,test proportions of the sequences of --data-path/--dataset; default 969,30,1 (Megatron's)."""
    data_cache_path: str | None = None
    """Directory for the sample index caches; default beside the data."""
    seed: int = flag(1234, valid=SEED_RANGE)
    """Seed of the model init, the data shuffle and dropout."""
    tokenizer_type: str | None = None
    """Tokenizer kind (for the EOD id and the vocabulary size); default per model, as Megatron's pretrain
    scripts set it: GPT2BPETokenizer for gpt, BertWordPieceLowerCase for t5 and bert."""
    vocab_file: str | None = flag(None, "--vocab")
    """Tokenizer vocabulary file."""
    merge_file: str | None = None
    """BPE merges file."""
    tokenizer_model: str | None = None
    """SentencePiece / HF tokenizer model file."""
    reset_position_ids: bool = False
    """GPT (Megatron's): position ids restart at 0 after every EOD token of a sample (needs the tokenizer's EOD)."""
    reset_attention_mask: bool = False
    """GPT (Megatron's): a token attends only to the earlier tokens of its own document in the sample (the
    attention runs with a [seq, seq] mask per sample instead of the causal kernel; not with pipelining)."""
    eod_mask_loss: bool = False
    """GPT (Megatron's): no loss at positions whose input token is EOD (the prediction across documents)."""
    no_create_attention_mask_in_dataloader: bool = False
    """Megatron's: batches carry no causal mask, the attention kernel applies it. Ours never carry one, so this
    changes nothing; with --reset-attention-mask it is refused (Megatron would then drop the document mask)."""
    num_workers: int = flag(2, valid=NON_NEGATIVE,
                            same_math="batches are read ahead by one background thread of the trainer (trainer.data."
                                      "batches), which yields the same batches in the same order for any number")
    """Megatron: the DataLoader's worker processes (its default 2)."""
    mock_data: bool = False
    """GPT (Megatron's MockGPTDataset): synthetic tokens instead of a dataset, for throughput runs: 100000
    documents of seeded lengths 1..4095, each 1, 2, 3, ... modulo the vocabulary then the tokenizer's EOD, split
    1,1,1 whatever --split says (as Megatron). Needs the vocabulary size and EOD id: --tokenizer-type
    NullTokenizer --vocab-size N (EOD N-1), or tokenizer files. Excludes --data-path and the other data paths."""
    no_mmap_bin_files: bool = False
    """Megatron's: read each .bin with plain file reads (one per sample piece) instead of a memory map, for file
    systems where maps are slow; the same tokens. (GPT's data; other families' data refuse it.)"""

    def __post_init__(self) -> None:
        check_ranges(self)
        if self.reset_attention_mask and self.no_create_attention_mask_in_dataloader:
            raise TrainConfigError("reset_attention_mask needs the per-sample mask that "
                                   "no_create_attention_mask_in_dataloader leaves out (Megatron would silently "
                                   "train with plain causal attention): give one of the two")
        if self.dataset and self.data_path:
            raise TrainConfigError("give either `dataset` or `data_path`, not both")
        if self.mock_data:
            self._check_mock_data()
            return
        if self._check_per_split_paths():
            return
        # Megatron's default split, filled in here so that a split given with per-split paths can be refused.
        self.split = DEFAULT_SPLIT if self.split is None else self.split
        problem = split_problem(self.split)
        if problem is not None:
            raise TrainConfigError(problem)

    def _check_mock_data(self) -> None:
        """Megatron's rule for mock data (one data source), and its split: 1,1,1 whatever `split` says (the
        `train` CLI warns when a user's split is so replaced).

        Raises:
            TrainConfigError: mock_data given with a data path.
        """
        paths = [name for name in ("data_path", "dataset", "train_data_path", "valid_data_path", "test_data_path")
                 if getattr(self, name)]
        if paths:
            given = " and ".join(f"`{name}`" for name in paths)
            raise TrainConfigError(f"`mock_data` excludes {given}: Megatron takes a single data source "
                                   "(synthetic tokens, or a dataset)")
        self.split = MOCK_SPLIT

    def _check_per_split_paths(self) -> bool:
        """True when the run gives per-split data paths (Megatron's --train-data-path ...), after checking them.

        Raises:
            TrainConfigError: per-split paths given with data_path, dataset or split, without a train path, or
                a malformed blend.
        """
        per_split = self.per_split_paths
        if all(words is None for words in per_split):
            return False
        if self.data_path or self.dataset:
            raise TrainConfigError("`data_path` (or `dataset`) excludes `train_data_path`, `valid_data_path` and "
                                   "`test_data_path`")
        if self.split is not None:
            raise TrainConfigError("`split` applies to `data_path` only; per-split data paths are used whole")
        if self.train_data_path is None:
            raise TrainConfigError("`valid_data_path` and `test_data_path` need `train_data_path` "
                                   "(the train split's blend)")
        for name, words in zip(SPLIT_NAMES, per_split):
            if words is not None:
                try:
                    parse_blend(words)
                except BlendFormatError as error:
                    raise TrainConfigError(f"`{name}_data_path`: {error}") from None
        return True

    @property
    def per_split_paths(self) -> tuple[list[str] | None, ...]:
        """The words of train_data_path, valid_data_path and test_data_path (None where not given)."""
        return self.train_data_path, self.valid_data_path, self.test_data_path

    @property
    def blend_per_split(self) -> list[tuple[list[str], list[float] | None] | None] | None:
        """Each split's (prefixes, weights or None: by size), parsed as `build-indices` does; None entries for
        the splits without a path; None when the run reads data_path or dataset (divided by ``split``)."""
        if all(words is None for words in self.per_split_paths):
            return None
        return [parse_blend(words) if words is not None else None for words in self.per_split_paths]

    def split_is_empty(self, name: str) -> bool:
        """True when the split ``name`` (train, valid or test) has no data: no share in ``split``, or no
        per-split data path."""
        if self.split is None:
            return self.per_split_paths[SPLIT_NAMES.index(name)] is None
        return parse_split(self.split)[SPLIT_NAMES.index(name)] == 0

    @property
    def blend(self) -> tuple[list[str], list[float] | None]:
        """Prefixes and their weights (None = weight by size), from either spelling.

        Raises:
            TrainConfigError: no prefix given (or mock_data, which only GPT reads), or weights and prefixes do not
                alternate.
        """
        if self.mock_data:
            raise TrainConfigError("`mock_data` is GPT's (Megatron's MockGPTDataset): this model reads a dataset")
        if self.dataset:
            return list(self.dataset), None
        if self.blend_per_split is not None:
            raise TrainConfigError("this model reads one blend (`data_path` or `dataset`), not per-split data paths")
        if not self.data_path:
            raise TrainConfigError("no training data: give `dataset` or `data_path`")
        if len(self.data_path) == 1:
            return list(self.data_path), None
        weights, prefixes = self.data_path[0::2], self.data_path[1::2]
        try:
            parsed = [float(w) for w in weights]
        except ValueError:
            raise TrainConfigError(f"data_path must be W1 P1 W2 P2 ... or a single prefix, got {self.data_path}")
        if len(weights) != len(prefixes):
            raise TrainConfigError(f"data_path has {len(weights)} weights but {len(prefixes)} prefixes")
        return prefixes, parsed


@dataclass(kw_only=True, slots=True)
class TrainingConfig:
    """Batch shape, run length, device."""

    micro_batch_size: int = flag(1, "--batch-size", valid=AT_LEAST_ONE)
    """Samples per forward pass on one data-parallel rank (CPM-Pretrain: --batch-size)."""
    global_batch_size: int | None = flag(None, valid=AT_LEAST_ONE)
    """Samples per optimiser step over all ranks; default micro x dp x accumulation."""
    num_accumulation_steps: int | None = flag(None, "--gas", valid=AT_LEAST_ONE)
    """Micro-batches per step per rank (CPM-Pretrain: --gas); derived from the global batch (accepted if
    consistent)."""
    train_iters: int | None = flag(None, valid=AT_LEAST_ONE)
    """Optimiser steps to train for; default 100, or what --train-samples makes (Megatron's: one of the two)."""
    train_samples: int | None = flag(None, valid=AT_LEAST_ONE)
    """Samples to train for, instead of train_iters (needs global_batch_size; the steps are the whole global
    batches): the lr_*_samples flags then size the learning-rate schedule."""
    rampup_batch_size: list[int] | None = flag(None, nargs=3)
    """Megatron's START INCR SAMPLES ramp: the global batch starts at START samples and grows by INCR in equal
    intervals of the first SAMPLES consumed samples up to global_batch_size (needed); the learning-rate schedule
    counts the samples each step takes. Not with pipelining (its schedule has a fixed micro-batch count)."""
    step_batch_size_schedule: str | None = flag(None)
    """Megatron's "THRESHOLD:BS ..." schedule (K/M/B/T suffixes): from THRESHOLD consumed tokens (seq_length
    per sample) on, the global batch is BS samples; the learning-rate schedule counts the samples each step
    takes. global_batch_size, if given (Megatron's GPT-3 example gives both; Megatron's HEAD refuses the pair),
    sizes the evaluations and the iteration-based schedule lengths. Not with pipelining."""
    device: str | None = flag(None, choices=("cpu", "cuda"))
    """Device kind; default cuda when available."""
    checkpoint_activations: bool = False
    """Recompute each block's activations in the backward pass (saves memory)."""
    compile: bool = False
    """torch.compile: the whole model in a one-process run, else each transformer block (inductor; the first steps
    pay the compile time)."""
    deepspeed_config: str | None = flag(None, "--deepspeed_config")
    """DeepSpeed JSON config whose batch, precision, ZeRO, optimiser and scheduler keys set our flags
    (`trainer.cli.deepspeed_config`); flags on the command line win."""
    exit_interval: int | None = flag(None, valid=AT_LEAST_ONE)
    """Megatron's: after the step whose iteration is divisible by this, save (with --save) and exit with code 0."""
    exit_duration_in_mins: float | None = flag(None, valid=POSITIVE)
    """Megatron's: after the first step that ends this many minutes after the run started, save (with --save) and
    exit with code 0; the ranks agree (the longest elapsed time counts), so all stop at the same step."""
    exit_signal_handler: bool = False
    """Megatron's: on --exit-signal (a Slurm --signal=TERM@120 before the time limit, a preemption) every rank
    finishes the step in flight, the run saves (with --save) and exits with code 0; the launcher of several
    processes passes the signal on to its workers."""
    exit_signal: str = flag("SIGTERM", choices=EXIT_SIGNALS)
    """Megatron's: the signal --exit-signal-handler catches."""
    calculate_per_token_loss: bool = False
    """Megatron's: the loss (and its gradient) is the mean over all loss tokens of the global batch (every
    micro-batch, every data/context-parallel rank), not the mean of each micro-batch's per-token mean; they
    differ when micro-batches hold different numbers of loss tokens (eod_mask_loss, T5's padding). Not for BERT."""

    def __post_init__(self) -> None:
        check_ranges(self)
        if self.rampup_batch_size is not None and self.step_batch_size_schedule is not None:
            raise TrainConfigError("give either rampup_batch_size or step_batch_size_schedule, not both")
        if self.rampup_batch_size is not None and self.global_batch_size is None:
            raise TrainConfigError("rampup_batch_size needs global_batch_size (the batch the ramp ends at)")
        if self.exit_signal != "SIGTERM" and not self.exit_signal_handler:
            raise TrainConfigError(f"exit_signal {self.exit_signal} needs exit_signal_handler")
        if self.train_samples is None:
            if self.train_iters is None:
                self.train_iters = DEFAULT_TRAIN_ITERS
            return
        if self.rampup_batch_size is not None or self.step_batch_size_schedule is not None:
            return  # the steps follow the schedule's batches (`TrainConfig.__post_init__`)
        if self.global_batch_size is None:
            raise TrainConfigError("train_samples needs global_batch_size (the steps it makes are "
                                   "train_samples // global_batch_size)")
        # Megatron's `update_train_iters`: whole batches only (a ramp's steps: `TrainConfig.batch_size_schedule`).
        iterations = self.train_samples // self.global_batch_size
        if iterations < 1:
            raise TrainConfigError(f"train_samples ({self.train_samples}) is less than one global batch "
                                   f"({self.global_batch_size})")
        if self.train_iters is not None and self.train_iters != iterations:
            raise TrainConfigError("give either train_iters or train_samples, not both")
        self.train_iters = iterations


@dataclass(kw_only=True, slots=True)
class PrecisionConfig:
    """Mixed precision (autocast over fp32 master weights)."""

    bf16: bool = False
    """Compute in bfloat16."""
    fp16: bool = False
    """Compute in float16 with dynamic loss scaling."""
    initial_loss_scale: float = flag(DEFAULT_INITIAL_LOSS_SCALE, valid=POSITIVE)
    """fp16: starting loss scale."""
    loss_scale_window: int = flag(1000, valid=AT_LEAST_ONE)
    """fp16: steps without overflow before the scale doubles."""
    hysteresis: int = flag(2, valid=AT_LEAST_ONE)
    """fp16: overflows tolerated before the scale halves."""
    min_loss_scale: float = flag(1.0, valid=POSITIVE)
    """fp16: the scale never drops below this."""
    loss_scale: float | None = flag(None, valid=POSITIVE)
    """fp16: a static loss scale (Megatron's; a positive power of 2 is exact); default: dynamic scaling."""
    no_check_for_nan_in_loss_and_grad: bool = False
    """Megatron's: without it (the default, as Megatron) a NaN or infinite loss, or gradient norm where no loss
    scaler owns overflows (fp16 or a static loss_scale skip such steps), stops the run with one line naming the
    iteration and the rank; with it such a step is skipped and counted, with a warning."""
    accumulate_allreduce_grads_in_fp32: bool = False
    """Megatron's: accumulate and reduce the gradients in fp32. Ours always are (the parameters stay fp32 under
    autocast, FSDP2 reduces in fp32), so this changes nothing."""
    disable_bf16_reduced_precision_matmul: bool = False
    """Megatron's: CUDA bf16 matmuls accumulate in fp32 only (torch.backends.cuda.matmul.
    allow_bf16_reduced_precision_reduction = False, for the whole process); no effect on a CPU."""
    attention_softmax_in_fp32: bool = flag(False, same_math="every attention here takes its softmax in float32 "
                                                        "under bf16 and fp16: SDPA's math kernel upcasts (torch's "
                                                        "fp16_bf16_reduction_math_sdp_allowed() is False), its "
                                                        "flash, memory-efficient and cuDNN kernels accumulate in "
                                                        "float32, and the keyed-dropout attention calls softmax "
                                                        "with dtype float32")
    """Megatron: the unfused attention's softmax in fp32 under bf16/fp16."""
    fp8_format: str | None = flag(None, choices=FP8_FORMATS)
    """Megatron's fp8 compute (Transformer Engine): refused (see fp8_param_gather)."""
    fp8_recipe: str | None = flag(None, choices=FP8_RECIPES)
    """Megatron's fp8 scaling recipe: refused (see fp8_param_gather)."""
    fp8_margin: int | None = flag(None, valid=NON_NEGATIVE)
    """Megatron's fp8 scaling margin: refused (see fp8_param_gather)."""
    fp8_interval: int | None = flag(None, valid=AT_LEAST_ONE)
    """Megatron's fp8 scaling-update interval: refused (see fp8_param_gather)."""
    fp8_amax_history_len: int | None = flag(None, valid=AT_LEAST_ONE)
    """Megatron's fp8 amax history length: refused (see fp8_param_gather)."""
    fp8_amax_compute_algo: str | None = flag(None, choices=FP8_AMAX_COMPUTE_ALGOS)
    """Megatron's fp8 amax algorithm: refused (see fp8_param_gather)."""
    fp8_param_gather: bool = False
    """Megatron's fp8 parameters and all-gather. Every fp8_* flag is refused in one line: fp8 needs NVIDIA
    Transformer Engine on a Hopper-or-newer GPU; this trainer computes in bf16, fp16 or fp32."""

    @property
    def loss_scaled(self) -> bool:
        """A loss scaler owns overflows (fp16's dynamic one, or a static ``loss_scale``): a step whose gradients
        overflow is skipped, not stopped on."""
        return self.fp16 or self.loss_scale is not None

    @property
    def skips_overflowing_steps(self) -> bool:
        """A step whose gradients are not finite is skipped, not stopped on (a loss scaler, or no NaN check): the
        host reads the step's gradient norm before deciding on its update."""
        return self.loss_scaled or self.no_check_for_nan_in_loss_and_grad

    def __post_init__(self) -> None:
        if self.bf16 and self.fp16:
            raise TrainConfigError("bf16 and fp16 are mutually exclusive")
        # `is not`: fp8_margin 0 is given too (0 == False).
        fp8 = next((f.name for f in fields(self) if f.name.startswith("fp8_") and getattr(self, f.name) is not None
                    and getattr(self, f.name) is not False), None)
        if fp8 is not None:
            raise TrainConfigError(f"`{fp8}`: fp8 needs NVIDIA Transformer Engine on a Hopper-or-newer GPU; this "
                                   "trainer computes in bf16, fp16 or fp32 (use bf16)")
        check_ranges(self)
        # Megatron's rules: a static scale applies with fp16 or bf16 (its ConstantGradScaler); fp32 would ignore
        # it. Its DynamicGradScaler asserts min_scale <= initial_scale.
        if self.loss_scale is not None and not (self.fp16 or self.bf16):
            raise TrainConfigError(f"loss_scale ({_number(self.loss_scale)}) applies with fp16 or bf16 only; "
                                   "fp32 trains unscaled")
        if self.fp16 and self.loss_scale is None and self.min_loss_scale > self.initial_loss_scale:
            raise TrainConfigError(f"min_loss_scale ({_number(self.min_loss_scale)}) is above initial_loss_scale "
                                   f"({_number(self.initial_loss_scale)})")


@dataclass(kw_only=True, slots=True)
class OptimizerConfig:
    """AdamW and the learning-rate schedule."""

    optimizer: str = flag("adamw", choices=("adamw", "adam"))
    """Optimiser (biases and norms get no weight decay); adam is Megatron's spelling of the same AdamW (its
    decoupled weight decay)."""
    lr: float = flag(1e-4, "--learning-rate", valid=POSITIVE)
    """Peak learning rate."""
    min_lr: float = flag(0.0, valid=NON_NEGATIVE)
    """Learning rate at the end of the decay (at most lr)."""
    lr_decay_style: str = flag("linear", choices=LR_DECAY_STYLES)
    """Shape of the decay after warm-up (Megatron's default: linear)."""
    lr_wsd_decay_style: str = flag("exponential", choices=LR_WSD_DECAY_STYLES)
    """WSD: shape of the annealing at the end of the decay."""
    lr_decay_iters: int | None = flag(None, valid=AT_LEAST_ONE)
    """Steps over which the lr decays; default train_iters."""
    lr_decay_samples: int | None = flag(None, valid=AT_LEAST_ONE)
    """With train_samples: samples over which the lr decays; default train_samples."""
    lr_wsd_decay_iters: int | None = flag(None, valid=AT_LEAST_ONE)
    """WSD: steps of the annealing (the last of the decay)."""
    lr_wsd_decay_samples: int | None = flag(None, valid=AT_LEAST_ONE)
    """WSD with train_samples: samples of the annealing."""
    lr_warmup_iters: int = flag(0, valid=NON_NEGATIVE)
    """Linear warm-up steps (fewer than the decay steps, as Megatron asserts)."""
    lr_warmup_samples: int = flag(0, valid=NON_NEGATIVE)
    """With train_samples: linear warm-up samples."""
    lr_warmup_fraction: float | None = flag(None, "--warmup", valid=FRACTION)
    """Warm-up as a fraction of the decay's samples (not rounded to steps), instead of lr_warmup_iters/samples
    (CPM-Pretrain: --warmup)."""
    lr_warmup_init: float = flag(0.0, valid=NON_NEGATIVE)
    """Learning rate of the first step; the warm-up rises from it to lr."""
    weight_decay: float = flag(0.01, valid=NON_NEGATIVE)
    """AdamW decoupled weight decay (weight_decay_incr_style constant)."""
    weight_decay_incr_style: str = flag("constant", choices=WD_INCR_STYLES)
    """Weight decay from start_weight_decay to end_weight_decay over the run (linear, cosine)."""
    start_weight_decay: float | None = flag(None, valid=NON_NEGATIVE)
    """Weight decay of the first step (weight_decay_incr_style linear or cosine)."""
    end_weight_decay: float | None = flag(None, valid=NON_NEGATIVE)
    """Weight decay at the end of the run (weight_decay_incr_style linear or cosine)."""
    decoupled_lr: float | None = flag(None, valid=POSITIVE)
    """Peak learning rate of the embedding and output layer (Megatron's); default lr."""
    decoupled_min_lr: float | None = flag(None, valid=NON_NEGATIVE)
    """Minimum learning rate of the embedding and output layer, with decoupled_lr; default min_lr."""
    override_opt_param_scheduler: bool = flag(False, "--override-opt_param-scheduler")
    """On resume, take the schedule's settings from these flags, not from the checkpoint."""
    use_checkpoint_opt_param_scheduler: bool = flag(False, "--use-checkpoint-opt_param-scheduler")
    """On resume, take the schedule's settings from the checkpoint, not from these flags."""
    adam_beta1: float = flag(0.9, valid=PROBABILITY)
    """AdamW beta1."""
    adam_beta2: float = flag(0.999, valid=PROBABILITY)
    """AdamW beta2."""
    adam_eps: float = flag(1e-8, valid=POSITIVE)
    """AdamW epsilon."""
    clip_grad: float = flag(1.0, valid=NON_NEGATIVE)
    """Clip the global gradient norm to this (0 = no clipping)."""

    def __post_init__(self) -> None:
        check_ranges(self)
        if self.lr_warmup_fraction is not None and (self.lr_warmup_iters or self.lr_warmup_samples):
            raise TrainConfigError("give either lr_warmup_fraction or lr_warmup_iters/lr_warmup_samples, not both")
        if self.min_lr > self.lr:
            raise TrainConfigError(f"min_lr ({self.min_lr}) is larger than lr ({self.lr})")
        varying = self.weight_decay_incr_style != "constant"
        given = (self.start_weight_decay is not None, self.end_weight_decay is not None)
        if varying and not all(given):
            raise TrainConfigError(f"weight_decay_incr_style {self.weight_decay_incr_style} needs "
                                   "start_weight_decay and end_weight_decay")
        if not varying and any(given):
            raise TrainConfigError("start_weight_decay and end_weight_decay need weight_decay_incr_style linear "
                                   "or cosine (constant uses weight_decay)")
        if self.decoupled_min_lr is not None and self.decoupled_lr is None:
            raise TrainConfigError("decoupled_min_lr needs decoupled_lr")

    def scheduler(self, training: TrainingConfig, global_batch_size: int) -> ParamScheduler:
        """The run's learning-rate schedule, as Megatron's `get_optimizer_param_scheduler` builds it: an
        iteration-based run (train_iters) has its lengths in steps times ``global_batch_size`` samples, a
        sample-based one (train_samples) in samples; a warm-up fraction is of the decay's samples, and weight
        decay changes over the whole run.

        Raises:
            TrainConfigError: a length of the other kind of run is given, or the lengths are inconsistent.
        """
        self.check_run_kind(training)
        if training.train_samples is None:
            decay_iters = self.lr_decay_iters if self.lr_decay_iters is not None else training.train_iters
            lr_decay_steps = decay_iters * global_batch_size
            wd_incr_steps = training.train_iters * global_batch_size
            wsd_decay_steps = None if self.lr_wsd_decay_iters is None else self.lr_wsd_decay_iters * global_batch_size
            lr_warmup_steps = self.lr_warmup_iters * global_batch_size
        else:
            lr_decay_steps = self.lr_decay_samples if self.lr_decay_samples is not None else training.train_samples
            wd_incr_steps = training.train_samples
            wsd_decay_steps = self.lr_wsd_decay_samples
            lr_warmup_steps = self.lr_warmup_samples
        if self.lr_warmup_fraction is not None:
            lr_warmup_steps = self.lr_warmup_fraction * lr_decay_steps
        constant_wd = self.weight_decay_incr_style == "constant"
        # The lengths no flag gave follow the run's length, also when a resumed run changes it.
        decay_given = self.lr_decay_iters is not None or self.lr_decay_samples is not None
        run_length_keys = {"wd_incr_steps"} | ({"lr_decay_steps"} if not decay_given else set()) | (
            {"lr_warmup_steps"} if not decay_given and self.lr_warmup_fraction is not None else set())
        return ParamScheduler(
            init_lr=self.lr_warmup_init, max_lr=self.lr, min_lr=self.min_lr, lr_warmup_steps=lr_warmup_steps,
            lr_decay_steps=lr_decay_steps, lr_decay_style=self.lr_decay_style,
            start_wd=self.weight_decay if constant_wd else self.start_weight_decay,
            end_wd=self.weight_decay if constant_wd else self.end_weight_decay,
            wd_incr_steps=wd_incr_steps, wd_incr_style=self.weight_decay_incr_style, wsd_decay_steps=wsd_decay_steps,
            lr_wsd_decay_style=self.lr_wsd_decay_style, use_checkpoint=self.use_checkpoint_opt_param_scheduler,
            override=self.override_opt_param_scheduler, run_length_keys=frozenset(run_length_keys))

    def check_run_kind(self, training: TrainingConfig) -> None:
        """Megatron's rules: an iteration-based run takes the ``*_iters`` lengths, a sample-based run the
        ``*_samples`` ones, WSD's length goes with WSD, and the warm-up is shorter than the decay.

        Raises:
            TrainConfigError: naming the length of the other kind, or the inconsistency.
        """
        by_samples = training.train_samples is not None
        other = ("lr_decay_iters", "lr_warmup_iters", "lr_wsd_decay_iters") if by_samples \
            else ("lr_decay_samples", "lr_warmup_samples", "lr_wsd_decay_samples")
        for name in other:
            if getattr(self, name):
                kind = "train_samples (use the *_samples lengths)" if by_samples \
                    else "train_iters (use the *_iters lengths, or give train_samples)"
                raise TrainConfigError(f"{name} does not apply to a run sized by {kind}")
        if self.lr_decay_style != "WSD" and (self.lr_wsd_decay_iters or self.lr_wsd_decay_samples):
            raise TrainConfigError("lr_wsd_decay_iters/lr_wsd_decay_samples need lr_decay_style WSD")
        if by_samples:
            unit, length, decay_flag, warmup = "samples", "train_samples", "lr_decay_samples", self.lr_warmup_samples
        else:
            unit, length, decay_flag, warmup = "steps", "train_iters", "lr_decay_iters", self.lr_warmup_iters
        decay = getattr(self, decay_flag) or getattr(training, length)
        if self.lr_warmup_fraction is not None:
            warmup = self.lr_warmup_fraction * decay
        if warmup and warmup >= decay:
            raise TrainConfigError(f"the warm-up ({count_text(warmup)} {unit}) must be shorter than the decay "
                                   f"({decay_flag}, default {length}: {count_text(decay)} {unit})")


@dataclass(kw_only=True, slots=True)
class ParallelismConfig:
    """How the model and the batch are divided over the processes."""

    tensor_model_parallel_size: int = flag(1, "--model-parallel-size", valid=AT_LEAST_ONE)
    """Tensor-parallel degree (heads, MLP and vocabulary sharded; CPM-Pretrain: --model-parallel-size)."""
    pipeline_model_parallel_size: int = flag(1, "--pipe-parallel-size", valid=NON_NEGATIVE)
    """Pipeline-parallel degree (layers split into stages); 0 means 1, as CPM-Pretrain's --pipe-parallel-size."""
    pipeline_schedule: str = flag("1f1b", choices=("1f1b", "gpipe", "interleaved"))
    """Pipeline schedule."""
    context_parallel_size: int = flag(1, valid=AT_LEAST_ONE)
    """Context-parallel degree (Megatron's --context-parallel-size): each sequence split over this many ranks
    (2 x this many chunks, Megatron's load-balanced layout), keys and values all-gathered in attention."""
    num_layers_per_virtual_pipeline_stage: int | None = flag(None, valid=AT_LEAST_ONE)
    """Interleaved schedule: layers per model chunk."""
    sequence_parallel: bool = False
    """Shard norms and dropout along the sequence over the tensor-parallel ranks."""
    use_distributed_optimizer: bool = False
    """Shard the optimiser state over data-parallel ranks: zero_stage 1, as Megatron's flag (MindFormers:
    optimizer_shard)."""
    zero_stage: int = flag(0, "--zero_stage", valid=Range(0, 3))
    """DeepSpeed's ZeRO stage over data-parallel ranks: 0 replicates everything, 1 shards the optimiser state,
    2 also the gradients, 3 also the parameters (FSDP2); pipeline parallelism takes 0 or 1."""
    cpu_offload: bool = flag(False, "--cpu_adam")
    """Keep the optimiser state and master weights on the CPU and step there (DeepSpeed's offload_optimizer,
    ZeRO-Offload); needs zero_stage >= 1."""
    overlap_grad_reduce: bool = False
    """Megatron: reduce the data-parallel gradients while the backward pass runs. DDP (data parallelism alone at
    ZeRO 0-1) and FSDP2 (ZeRO 2-3) do so here bucket by bucket / block by block (with or without this flag);
    with tensor or pipeline parallelism at ZeRO 0-1 the gradients are averaged after the backward pass (the
    same result, not overlapped: a warning says so)."""
    overlap_param_gather: bool = False
    """Megatron: all-gather the sharded parameters while the forward pass runs (with overlap_grad_reduce and a
    sharded optimiser, Megatron's rules). FSDP2 (ZeRO 2-3) prefetches the next block's parameters here;
    ZeRO 1 all-gathers them after the optimiser step (the same result, not overlapped: a warning says so)."""
    grad_reduce_in_bf16: bool = False
    """Megatron's (with bf16): the data-parallel gradients are reduced in bfloat16 (half the traffic, bf16
    rounding of every reduced gradient), then the optimiser steps fp32 weights as before: FSDP2's reduce_dtype,
    DDP's bf16_compress_hook, the averaging after the backward pass (TP/PP) in bf16. Not with expert
    parallelism (the experts' own reduction stays fp32)."""
    keyed_dropout: bool = False
    """Draw dropout masks from a hash of (seed, sample, layer, position, head/feature) instead of the random
    stream, so that every tensor/pipeline/data-parallel layout drops the same elements and gives the same
    losses (attention with dropout then runs unfused: slower)."""

    def __post_init__(self) -> None:
        check_ranges(self)
        # CPM-Pretrain's pp_size=0 means "no pipeline", as 1 does.
        self.pipeline_model_parallel_size = max(self.pipeline_model_parallel_size, 1)
        # Megatron turns sequence parallelism off without tensor parallelism (its numerics would change for
        # nothing); `train` says so in a warning.
        if self.tensor_model_parallel_size == 1:
            self.sequence_parallel = False
        if self.num_layers_per_virtual_pipeline_stage is not None and self.pipeline_schedule != "interleaved":
            raise TrainConfigError("num_layers_per_virtual_pipeline_stage needs pipeline_schedule interleaved")
        if self.use_distributed_optimizer:
            self.zero_stage = max(self.zero_stage, 1)
        if self.zero_stage > 1 and self.pipeline_model_parallel_size > 1:
            # DeepSpeed's rule too: sharded gradients (and parameters) would be reduced (gathered) once per
            # micro-batch of the schedule.
            raise TrainConfigError(f"zero_stage {self.zero_stage} does not combine with pipeline_model_parallel_size "
                                   f"({self.pipeline_model_parallel_size}) > 1: use zero_stage 0 or 1")
        if self.cpu_offload and self.zero_stage == 0:
            raise TrainConfigError("cpu_offload needs zero_stage >= 1 (DeepSpeed's offload_optimizer is a ZeRO option)")
        if self.overlap_param_gather and not (self.overlap_grad_reduce and self.zero_stage >= 1):
            raise TrainConfigError("overlap_param_gather needs overlap_grad_reduce and use_distributed_optimizer "
                                   "(or zero_stage >= 1), as Megatron")


@dataclass(kw_only=True, slots=True)
class LaunchConfig:
    """Processes and nodes (what torchrun would be told)."""

    num_gpus_per_node: int = flag(1, "--nproc-per-node", valid=AT_LEAST_ONE, env=("GPUS_PER_NODE",))
    """Processes per node (GPUs, or CPU processes with device cpu)."""
    num_nodes: int = flag(1, valid=AT_LEAST_ONE, env=("NNODES", "NODE"))
    """Number of nodes."""
    node_rank: int = flag(0, valid=NON_NEGATIVE, env=("NODE_RANK",))
    """Rank of this node, below num_nodes."""
    master_addr: str = flag("127.0.0.1", "--node-ips", env=("MASTER_ADDR", "ADDR"))
    """Address of node 0 (a comma-separated node list: its first entry)."""
    master_port: int = flag(29500, valid=PORT_RANGE, env=("MASTER_PORT", "PORT"))
    """Rendezvous port on node 0 (0 = any free port, single node only)."""
    dist_timeout: int = flag(DEFAULT_DIST_TIMEOUT_S, valid=AT_LEAST_ONE)
    """Seconds each node waits at start-up for the others before giving up with one line."""
    distributed_timeout_minutes: float = flag(DEFAULT_DISTRIBUTED_TIMEOUT_MINUTES, valid=POSITIVE)
    """Megatron's: minutes a collective (an all-reduce, a pipeline send) waits for the other ranks; past it the
    run ends with one line naming the rank that waited and the last completed iteration (then --max-restarts
    applies). Fractions of a minute are accepted (0.05 = 3 s), unlike Megatron's whole minutes."""
    max_restarts: int = flag(0, valid=NON_NEGATIVE)
    """torchrun's: when a process dies, stop all of them and start them again, up to this many times; each
    restart resumes from the latest complete checkpoint of --save (the same data order)."""

    def __post_init__(self) -> None:
        check_ranges(self)
        if self.master_port == 0 and self.num_nodes > 1:
            raise TrainConfigError(f"master_port 0 (any free port) works on a single node only, "
                                   f"not with num_nodes {self.num_nodes}")
        self.master_addr = self.master_addr.split(",")[0].strip()
        if not 0 <= self.node_rank < self.num_nodes:
            raise TrainConfigError(f"node_rank ({self.node_rank}) must be in [0, num_nodes={self.num_nodes})")


# Megatron's --ckpt-format names: ours (torch.distributed.checkpoint directories), and its legacy per-rank files.
CKPT_FORMAT = "torch_dist"
LEGACY_CKPT_FORMAT = "torch"


@dataclass(kw_only=True, slots=True)
class CheckpointConfig:
    """Saving and resuming."""

    save: str | None = None
    """Directory to save checkpoints into."""
    load: str | None = None
    """Directory to resume from (its latest checkpoint; a `convert-checkpoint --from-hf` one starts at step 0)."""
    load_hf: str | None = None
    """Hugging Face GPT-2, T5 or mT5 directory to start from (its shape and tokenizer files become the defaults)."""
    save_interval: int | None = flag(None, valid=AT_LEAST_ONE)
    """Save every this many steps (and at the end); default only at the end."""
    no_verify: bool = False
    """Load without checking the checkpoint's files against its manifest (checksums written at save)."""
    overwrite_save: bool = False
    """Start a fresh run in --save although it holds another run (checkpoints, metrics.jsonl) that this one does
    not resume (--load elsewhere or none): that run's iterations, pointer, model_config.json, tokenizer files and
    metrics.jsonl are deleted first (other files are kept). Without it such a --save is refused."""
    keep_last_checkpoints: int | None = flag(None, valid=AT_LEAST_ONE)
    """torchtitan's keep_latest_k: after a checkpoint is complete, remove the older ones of --save but the
    latest K (never the one the run loaded from); default: keep all."""
    async_save: bool = False
    """Megatron's: write each checkpoint in the background while the steps go on (the state is first copied
    to CPU memory); a save waits for the previous one, the run's end for the last, and a checkpoint is the
    latest only once complete."""
    no_load_optim: bool = False
    """Megatron's: resume the weights, iteration and consumed samples of --load, but start the optimiser state,
    the fp16 loss scale and the learning-rate schedule afresh (step 0 of the schedule)."""
    no_load_rng: bool = False
    """Megatron's: do not restore the random-number generators' states of --load (dropout draws anew)."""
    finetune: bool = False
    """Megatron's: take only the weights of --load; the iteration, consumed samples, optimiser, schedule and
    random states start afresh (iteration 0)."""
    no_save_optim: bool = False
    """Megatron's: checkpoints hold no optimiser state, loss scale or schedule (smaller); a run resuming from one
    starts those afresh, as with --no-load-optim."""
    no_save_rng: bool = False
    """Megatron's: checkpoints hold no random-number generator states."""
    ckpt_format: str = flag(CKPT_FORMAT, choices=(CKPT_FORMAT, LEGACY_CKPT_FORMAT))
    """Megatron's checkpoint format: torch_dist (ours: torch.distributed.checkpoint directories; any layout
    reads any other). torch (Megatron's per-rank model_optim_rng.pt files) is refused: train neither writes
    nor reads it."""
    auto_detect_ckpt_format: bool = False
    """Megatron's: find the format of --load from its files. Ours always does, so this changes nothing: a
    torch_dist checkpoint loads, a Megatron torch-format one (mp_rank_*/model_optim_rng.pt) is refused in one
    line naming it."""

    def __post_init__(self) -> None:
        check_ranges(self)
        if self.ckpt_format == LEGACY_CKPT_FORMAT:
            raise TrainConfigError(f"ckpt_format {LEGACY_CKPT_FORMAT} (Megatron's per-rank model_optim_rng.pt files) "
                                   f"is not supported: train writes and reads {CKPT_FORMAT} checkpoints only")
        if self.load is not None and self.load_hf is not None:
            # Megatron has one --load; which weights the run would start from is not for us to guess.
            raise TrainConfigError("give `load` (a checkpoint to resume) or `load_hf` (a Hugging Face model to start "
                                   "from), not both")
        for name in ("keep_last_checkpoints", "async_save"):
            if getattr(self, name) and self.save is None:
                raise TrainConfigError(f"{name} needs `save` (the directory checkpoints are written into)")


@dataclass(kw_only=True, slots=True)
class LoggingConfig:
    """Log lines, metrics file, evaluation."""

    log_interval: int = flag(100, valid=AT_LEAST_ONE)
    """Log a training line every this many steps."""
    eval_interval: int = flag(DEFAULT_EVAL_INTERVAL, valid=AT_LEAST_ONE)
    """Evaluate on the valid split every this many steps (a split without a valid share: never, with a
    warning). Not given, Megatron-LM's arguments.py evaluated every 1000 steps too (ours); its config
    dataclasses (2026) default it to None: no evaluation during training, only the one after it."""
    eval_iters: int = flag(DEFAULT_EVAL_ITERS, valid=NON_NEGATIVE)
    """Global batches per evaluation (0 = no evaluation)."""
    tensorboard_dir: str | None = None
    """Also write TensorBoard scalars here (needs tensorboard installed)."""
    metrics_file: str | None = None
    """JSON-lines metrics file; default <save>/metrics.jsonl, none without --save."""
    print_memory: bool = flag(False, "--print_memory")
    """After the first step, log each rank's bytes in parameters, gradients and optimiser state (device and
    CPU apart) and its peak memory, and write a memory record to the metrics file."""
    timing_log_level: int = flag(0, valid=Range(0, 2))
    """Megatron's flag. 0: the log line times whole steps; 1: also each phase, as Megatron's level-1 timers and
    DeepSpeed's wall_clock_breakdown: forward+backward (with the data-parallel gradient reduction that
    overlaps it), gradient norm and clipping, optimiser step, data wait; in ms per step, in the log line and
    the metrics file (the device is synchronised at each phase boundary, which costs some overlap). 2: also
    Megatron's level-2 forward-compute and backward-compute, summed over the micro-batches (a device sync
    around each: slower); a pipelined run has no such split (its schedule interleaves them with the stage
    sends, which Megatron's level 2 times and ours cannot), so it logs level 1's phases."""

    def __post_init__(self) -> None:
        check_ranges(self)
        if self.tensorboard_dir is not None and importlib.util.find_spec("tensorboard") is None:
            raise TrainConfigError("tensorboard_dir needs the tensorboard package: pip install tensorboard")


@dataclass(kw_only=True, slots=True)
class MaskingConfig:
    """Corrupted samples (read with model t5 and bert): what T5's spans and BERT's masks cover, how often short."""

    mask_prob: float = flag(0.15, valid=Range(0, 1, low_open=True, high_open=True))
    """Noise density: the fraction of a sample's tokens replaced by spans (BERT: masked)."""
    short_seq_prob: float = flag(0.1, valid=FRACTION)
    """Probability of a sample with a shorter random target length (T5 and BERT)."""

    def __post_init__(self) -> None:
        check_ranges(self)


@dataclass(kw_only=True, slots=True)
class MoEConfig:
    """Mixture of experts (`trainer.moe`): Megatron's spellings, DeepSpeed's as aliases."""

    moe: bool = False
    """DeepSpeed's switch: the run is a MoE (num_experts must be given); implied by num_experts."""
    num_experts: int | None = flag(None, "--moe-num-experts", "--moe_num_experts", valid=Range(2))
    """Experts per MoE layer (DeepSpeed: --moe_num_experts); none: a dense model."""
    expert_model_parallel_size: int = flag(1, "--moe-ep-size", "--moe_ep_size", valid=AT_LEAST_ONE)
    """Expert-parallel degree: experts sharded over this many data-parallel ranks (DeepSpeed: --moe_ep_size)."""
    moe_router_topk: int = flag(2, valid=Range(1, 2))
    """Experts per token: 1 (Switch) or 2 (GShard, Megatron's default)."""
    moe_router_pre_softmax: bool = False
    """Softmax over all experts before top-k (Switch); default: softmax over the top-k logits (Megatron)."""
    moe_aux_loss_coeff: float = flag(0.0, "--moe-loss-coeff", valid=NON_NEGATIVE)
    """Weight of the load-balancing loss (Switch/GShard; the papers use 0.01; Megatron-DeepSpeed: --moe-loss-coeff)."""
    moe_z_loss_coeff: float = flag(0.0, valid=NON_NEGATIVE)
    """Weight of the router z-loss (ST-MoE uses 0.001)."""
    moe_expert_capacity_factor: float | None = flag(None, "--moe-train-capacity-factor", valid=POSITIVE)
    """Expert capacity as a multiple of the balanced share; assignments past it are dropped (residual
    only); none: dropless."""
    moe_expert_capacity: int | None = flag(None, valid=AT_LEAST_ONE)
    """Assignments an expert takes per sequence, first come first kept (Hugging Face Switch Transformers'
    expert_capacity); none: see moe_expert_capacity_factor."""
    moe_layer_freq: int = flag(1, valid=AT_LEAST_ONE)
    """Every k-th feed-forward layer (from moe_layer_offset) is a MoE layer; Switch Transformers use 2."""
    moe_layer_offset: int = flag(0, valid=NON_NEGATIVE)
    """The first MoE layer of a stack (Switch Transformers: 1)."""
    moe_input_jitter_eps: float | None = flag(None, valid=Range(0, 1, low_open=True, high_open=True))
    """Training: multiply the router's input by uniform(1-eps, 1+eps) noise (Switch; DeepSpeed's
    noisy_gate_policy Jitter); none: no noise."""
    moe_router_load_balancing_type: str = flag("aux_loss", choices=LOAD_BALANCING_TYPES)
    """aux_loss: the load-balancing loss over each micro-batch's tokens (Switch/GShard); seq_aux_loss: the mean
    over its sequences of each sequence's own (DeepSeek-V2); none: no load-balancing loss (Megatron's)."""
    moe_router_dtype: str = flag("fp32", choices=ROUTER_DTYPES)
    """What the router's logits, softmax and auxiliary losses compute in: fp32 (also under bf16/fp16) or fp64."""
    moe_ffn_hidden_size: int | None = flag(None, valid=AT_LEAST_ONE)
    """Width of each expert's MLP; default ffn_hidden_size."""
    moe_per_layer_logging: bool = False
    """Also report each MoE layer's aux and z-loss under its own name (moe_aux_loss/<layer>), in the log line,
    the metrics file, TensorBoard and W&B."""
    moe_grouped_gemm: bool = flag(False, same_math="the experts always run as one grouped matrix product per "
                                                   "projection over the tokens sorted by expert (trainer.moe.experts)")
    """Megatron: grouped GEMM for the experts."""
    moe_token_dispatcher_type: str = flag("allgather", choices=("allgather", "alltoall"),
                                          same_math="each token reaches the same experts and returns in the same "
                                                    "order either way; under expert parallelism tokens travel by "
                                                    "all-to-all here")
    """Megatron: how tokens travel to the experts' ranks."""
    moe_permute_fusion: bool = flag(False, same_math="tokens are sorted by expert with index_select and summed back "
                                                     "with index_add, the values a fused permute kernel gives")
    """Megatron: fused token permutation kernels."""

    def __post_init__(self) -> None:
        check_ranges(self)
        if self.moe and self.num_experts is None:
            raise TrainConfigError("`moe` needs num_experts")
        if self.num_experts is not None and self.moe_router_topk > self.num_experts:
            raise TrainConfigError(f"moe_router_topk ({self.moe_router_topk}) exceeds num_experts ({self.num_experts})")
        if self.num_experts is None and self.expert_model_parallel_size > 1:
            raise TrainConfigError(f"expert_model_parallel_size ({self.expert_model_parallel_size}) needs num_experts")
        if self.num_experts is None:
            # The moe_* fields shape MoE layers only: a dense model would silently ignore them.
            unused = [f.name for f in fields(self) if f.name.startswith("moe_") and getattr(self, f.name) != f.default]
            if unused:
                raise TrainConfigError(f"{', '.join(unused)} {'needs' if len(unused) == 1 else 'need'} num_experts "
                                       "(a dense model has no MoE layers)")
        if self.moe_router_load_balancing_type == "none" and self.moe_aux_loss_coeff:
            raise TrainConfigError(f"moe_aux_loss_coeff ({self.moe_aux_loss_coeff}) weighs a load-balancing loss; "
                                   "moe_router_load_balancing_type none has none")
        if self.moe_expert_capacity is not None and self.moe_expert_capacity_factor is not None:
            raise TrainConfigError(f"moe_expert_capacity ({self.moe_expert_capacity}) and moe_expert_capacity_factor "
                                   f"({self.moe_expert_capacity_factor}) exclude each other")


@dataclass(kw_only=True, slots=True)
class RecomputeConfig:
    """Activation recomputation with Megatron's flags and meaning (`trainer.parallel.recompute`)."""

    recompute_activations: bool = False
    """Megatron's shorthand for recompute_granularity selective."""
    recompute_granularity: str | None = flag(None, choices=RECOMPUTE_GRANULARITIES)
    """full: recompute whole layers (recompute_method and recompute_num_layers say which); selective: recompute
    only each attention's core, softmax(q k^T) v (Megatron's core_attn), in every layer."""
    recompute_method: str | None = flag(None, choices=RECOMPUTE_METHODS)
    """Full granularity: uniform recomputes every layer, recompute_num_layers consecutive layers per
    checkpoint; block recomputes the first recompute_num_layers layers of each pipeline stage, the rest not."""
    recompute_num_layers: int | None = flag(None, valid=AT_LEAST_ONE)
    """Full granularity: layers per checkpoint (uniform), or layers recomputed per pipeline stage (block)."""

    def __post_init__(self) -> None:
        check_ranges(self)
        if self.recompute_activations:
            if self.recompute_granularity == "full":
                raise TrainConfigError("recompute_activations means recompute_granularity selective, not full")
            self.recompute_granularity = "selective"
        given = [name for name in ("recompute_method", "recompute_num_layers") if getattr(self, name) is not None]
        # megatron-core's TransformerConfig rules (it ignores both without a granularity; we say so instead).
        if self.recompute_granularity != "full" and given:
            raise TrainConfigError(f"{' and '.join(given)} apply to recompute_granularity full only")
        if self.recompute_granularity == "full" and len(given) < 2:
            raise TrainConfigError("recompute_granularity full needs recompute_method (uniform or block) and "
                                   "recompute_num_layers")

    def policy(self, checkpoint_activations: bool) -> Recompute | bool:
        """What the model recomputes: these flags, else ``--checkpoint-activations`` (True: every layer)."""
        if self.recompute_granularity is None:
            return checkpoint_activations
        return Recompute(self.recompute_granularity, self.recompute_method, self.recompute_num_layers)


# Why each of Megatron's kernel switches changes nothing in this trainer (`flag`'s same_math).
_SDPA = "attention runs in torch's scaled_dot_product_attention (its own fused scale, mask and softmax)"
_EAGER = "the bias, activation and dropout run as separate PyTorch ops, the math a fused kernel computes"
_AUTOGRAD = "weight gradients accumulate through autograd into .grad, the sums a fused kernel computes"


@dataclass(kw_only=True, slots=True)
class KernelConfig:
    """Attention kernels and Megatron's kernel-fusion switches."""

    attention_backend: str = flag("auto", choices=ATTENTION_BACKENDS)
    """Attention kernel of torch's SDPA (`trainer.parallel.attention_backend`): auto lets torch choose; flash its
    flash kernel; fused its memory-efficient and cuDNN kernels; unfused and local its math kernel (softmax(q
    k^T) v in PyTorch ops). One the device does not have is refused before the run starts. (On CUDA the flash
    kernel takes no attention bias: T5's and BERT's attention need fused, unfused or auto there.)"""
    use_flash_attn: bool = False
    """Megatron's older spelling of attention_backend flash."""
    no_masked_softmax_fusion: bool = flag(False, same_math=_SDPA)
    """Megatron: no fused scale+mask+softmax kernel."""
    no_bias_gelu_fusion: bool = flag(False, same_math=_EAGER)
    """Megatron: no fused bias+GELU kernel."""
    no_bias_dropout_fusion: bool = flag(False, same_math=_EAGER)
    """Megatron: no fused bias+dropout+add kernel."""
    no_gradient_accumulation_fusion: bool = flag(False, same_math=_AUTOGRAD)
    """Megatron: no fused weight-gradient accumulation (APEX's fused_weight_gradient_mlp_cuda)."""
    no_rope_fusion: bool = flag(False, same_math="rotary embeddings, where a model has them, are applied by "
                                                 "PyTorch ops, the rotation a fused kernel applies")
    """Megatron: no fused rotary-embedding kernel."""
    cross_entropy_loss_fusion: bool = flag(False, same_math="the loss is torch's cross_entropy over the "
                                                            "vocabulary (shards), the value a fused kernel gives")
    """Megatron: a fused cross-entropy kernel."""
    use_mcore_models: bool = flag(False, same_math="this trainer has one implementation of each model")
    """Megatron: build megatron-core's models rather than its legacy ones."""
    transformer_impl: str = flag("local", choices=("local", "transformer_engine"),
                                 same_math="local is this trainer's PyTorch layers; transformer_engine is refused "
                                           "(Transformer Engine is not used)")
    """Megatron: the transformer layers' implementation."""
    init_model_with_meta_device: bool = flag(False, same_math="every rank always builds the model on the meta "
                                                              "device, then allocates only its own share")
    """Megatron: build the model on the meta device first."""
    empty_unused_memory_level: int = flag(0, valid=Range(0, 2),
                                          same_math="it only hands the CUDA caching allocator's free blocks back to "
                                                    "the driver (torch.cuda.empty_cache), which torch reuses anyway; "
                                                    "no number of the run depends on it")
    """Megatron: 1 empties the CUDA cache after forward-backward, 2 also after the optimiser step."""

    def __post_init__(self) -> None:
        check_ranges(self)
        if self.transformer_impl == "transformer_engine":
            raise TrainConfigError("transformer_impl transformer_engine: Transformer Engine is not used by train; "
                                   "use transformer_impl local (the same layers in PyTorch)")
        if self.use_flash_attn:
            if self.attention_backend not in ("auto", "flash"):
                raise TrainConfigError(f"use_flash_attn means attention_backend flash, not {self.attention_backend}")
            self.attention_backend = "flash"


@dataclass(kw_only=True, slots=True)
class ObservabilityConfig:
    """Megatron's logging, Weights & Biases, profiling, memory-history and garbage-collection flags."""

    log_throughput: bool = flag(False, same_math="the log line always shows tokens/s and TFLOP/s per device (and "
                                                 "MFU where the device's peak is known)")
    """Megatron: add the throughput to the log line."""
    logging_level: int | None = flag(None, valid=Range(0, 50))
    """Python logging level of rank 0's log (10 DEBUG, 20 INFO, 30 WARNING, ...); the other ranks log
    warnings and errors, or only what this level lets through if it is higher. Default: INFO."""
    wandb_project: str | None = None
    """Also send every metrics record to this Weights & Biases project (rank 0; needs pip install wandb;
    WANDB_MODE=offline keeps the run local)."""
    wandb_exp_name: str | None = None
    """Weights & Biases run name (with wandb_project)."""
    wandb_save_dir: str | None = None
    """Directory of the local Weights & Biases files (with wandb_project); default wandb's own."""
    profile: bool = False
    """Record a torch.profiler trace of the steps profile_step_start up to (not including) profile_step_end on
    the ranks profile_ranks names, into <tensorboard_dir, else save>/torch_profile (Chrome trace JSON, one per
    rank: open it in Perfetto or TensorBoard's profiler)."""
    profile_step_start: int = flag(10, valid=NON_NEGATIVE)
    """First profiled step (Megatron's default 10)."""
    profile_step_end: int = flag(12, valid=AT_LEAST_ONE)
    """The step the profile stops before (Megatron's default 12)."""
    use_pytorch_profiler: bool = flag(False, same_math="profile always records with torch.profiler here")
    """Megatron: profile with torch.profiler instead of an nsys capture range."""
    profile_ranks: list[int] = flag([0], nargs="+", valid=NON_NEGATIVE)
    """Global ranks that profile (and dump memory snapshots); Megatron's default: rank 0."""
    record_memory_history: bool = False
    """CUDA only: record the allocator's history and dump a snapshot (for pytorch.org/memory_viz) at every log
    line on the ranks of profile_ranks."""
    memory_snapshot_path: str = "snapshot.pickle"
    """Where record_memory_history writes: PATH with _<rank> before its suffix (snapshot_0.pickle)."""
    manual_gc: bool = False
    """Turn Python's automatic garbage collector off for the run (Megatron: aligns collections across ranks);
    collect at the start and every manual_gc_interval steps."""
    manual_gc_interval: int = flag(0, valid=NON_NEGATIVE)
    """With manual_gc: a full collection after every this many steps (0: only at the start)."""

    def __post_init__(self) -> None:
        check_ranges(self)
        wandb_options = [name for name in ("wandb_exp_name", "wandb_save_dir") if getattr(self, name) is not None]
        if wandb_options and self.wandb_project is None:
            raise TrainConfigError(f"{' and '.join(wandb_options)} need wandb_project")
        if self.wandb_project is not None and importlib.util.find_spec("wandb") is None:
            raise TrainConfigError("wandb_project needs the wandb package: pip install wandb")
        if self.profile and self.profile_step_end <= self.profile_step_start:
            raise TrainConfigError(f"profile_step_end ({self.profile_step_end}) must be after profile_step_start "
                                   f"({self.profile_step_start})")
        if self.manual_gc_interval and not self.manual_gc:
            raise TrainConfigError("manual_gc_interval needs manual_gc")


@dataclass(kw_only=True, slots=True)
class TrainConfig:
    """One training run."""

    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    parallelism: ParallelismConfig = field(default_factory=ParallelismConfig)
    launch: LaunchConfig = field(default_factory=LaunchConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    masking: MaskingConfig = field(default_factory=MaskingConfig)
    families: dict[str, Any] = field(default_factory=dict)
    """The run's family's own section by the family's name (``{"t5": T5Config(...)}``:
    `trainer.family.spec.ModelSpec.settings`), which the ``train`` flags build from the registry; read with
    `section` (which adds the defaults of one the config was built without). The flag table lists every
    family's section here, between logging and moe."""
    moe: MoEConfig = field(default_factory=MoEConfig)
    recompute: RecomputeConfig = field(default_factory=RecomputeConfig)
    kernels: KernelConfig = field(default_factory=KernelConfig)
    observability: ObservabilityConfig = field(default_factory=ObservabilityConfig)

    def __post_init__(self) -> None:
        # The rules that depend on the family (fused_qkv, no_mmap_bin_files, MoE layers per stack) are
        # `trainer.family.checks.check_family_options`, which the top runs with the family's spec.
        if self.parallelism.grad_reduce_in_bf16:
            # Megatron reads it under bf16 only (its fp32 and fp16 runs reduce in the parameters' dtype).
            if not self.precision.bf16:
                raise TrainConfigError("grad_reduce_in_bf16 applies with bf16 only")
            if self.precision.accumulate_allreduce_grads_in_fp32:
                raise TrainConfigError("give grad_reduce_in_bf16 or accumulate_allreduce_grads_in_fp32, not both")
            if self.moe.expert_model_parallel_size > 1:
                raise TrainConfigError("grad_reduce_in_bf16 does not combine with expert_model_parallel_size > 1: "
                                       "the experts' gradients are reduced in fp32 only")
        if self.training.checkpoint_activations and self.recompute.recompute_granularity is not None:
            raise TrainConfigError("give checkpoint_activations (every layer recomputed) or recompute_granularity, "
                                   "not both")
        if self.observability.profile and self.logging.tensorboard_dir is None and self.checkpoint.save is None:
            raise TrainConfigError("`profile` needs tensorboard_dir or `save` (the trace goes to its torch_profile/)")
        schedule = self.batch_size_schedule()
        if schedule is not None and self.parallelism.pipeline_model_parallel_size > 1:
            name = "rampup_batch_size" if self.training.rampup_batch_size else "step_batch_size_schedule"
            raise TrainConfigError(f"{name} does not combine with pipeline_model_parallel_size > 1: the pipeline "
                                   "schedule runs a fixed number of micro-batches per step")
        if schedule is not None and self.training.train_samples is not None:
            # Megatron's `update_train_iters` for a batch that changes: the steps the samples take.
            ramp = self.training.rampup_batch_size
            iterations = train_iters_for_samples(self.training.train_samples, schedule,
                                                 self.training.global_batch_size or 0,
                                                 ramp[2] if ramp is not None else None)
            if self.training.train_iters not in (None, iterations):
                raise TrainConfigError("give either train_iters or train_samples, not both")
            self.training.train_iters = iterations
        # Rules across sections that need no world size (those that do: `trainer.parallel.dims`).
        # The schedule's own rules (a warm-up shorter than the decay, ...). Any batch size gives the same verdict:
        # an iteration-based run's lengths all scale with it.
        self.optimizer.scheduler(self.training, self.training.global_batch_size or 1)

    def section(self, name: str, default: Callable[[], Any] | None = None) -> Any:
        """Section ``name``: a core one (``model``) or a family's own (``t5``), which ``default()`` creates and
        `families` keeps when the config was built without it.

        Raises:
            TrainConfigError: no such section (a family's, asked for without a default).
        """
        if name in self.families:
            return self.families[name]
        if default is not None:
            return self.families.setdefault(name, default())
        if name in {f.name for f in fields(self)} and name != FAMILIES_FIELD:
            return getattr(self, name)
        raise TrainConfigError(f"the config has no section {name!r}")

    def batch_size_schedule(self) -> BatchSizeSchedule | None:
        """The global batch size of each step (consumed samples -> samples) when it changes during the run
        (--rampup-batch-size, --step-batch-size-schedule with thresholds in tokens of seq_length); None: constant.

        Raises:
            TrainConfigError: the ramp or the schedule is malformed.
        """
        training = self.training
        if training.rampup_batch_size is not None:
            start, increment, samples = training.rampup_batch_size
            return RampupBatchSize(start, increment, samples, final=training.global_batch_size)
        if training.step_batch_size_schedule is not None:
            return parse_step_batch_size_schedule(training.step_batch_size_schedule, self.model.seq_length)
        return None
