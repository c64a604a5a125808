"""`TrainConfig`: every setting of a training run, one sub-dataclass per concern.

Field names follow Megatron-LM's flags (``num_layers`` is ``--num-layers``). Each field carries a
one-line docstring; `trainer.cli_args` turns the fields and their docstrings into the ``train`` flags.
Checks that need only one section live in that section's ``__post_init__``; checks that span sections
and the world size live in `trainer.parallel_dims.ParallelDims`.

Example:
    >>> cfg = TrainConfig(model=ModelConfig(num_layers=2, hidden_size=64, num_attention_heads=4,
    ...                                     seq_length=32, vocab_size=1000),
    ...                   data=DataConfig(dataset=["data/my_text_document"]),
    ...                   training=TrainingConfig(micro_batch_size=4, global_batch_size=8,
    ...                                           train_iters=10, device="cpu"))
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from typing import Any

from trainer.errors import TrainConfigError

MODEL_KINDS = ("gpt", "t5")
# T5's MLP kinds (Hugging Face's feed_forward_proj): v1.0's ReLU, v1.1/mT5's gated GELU.
FEED_FORWARD_KINDS = ("relu", "gated-gelu")
# Megatron's default: the loss scale starts at 2**32 and halves on every overflow until it fits.
DEFAULT_INITIAL_LOSS_SCALE = 2.0**32


def flag(default: Any = None, *aliases: str, choices: tuple[str, ...] | None = None, nargs: str | None = None) -> Any:
    """A dataclass field with extra command-line spellings (``--lr`` also as ``--learning-rate``)."""
    kwargs: dict[str, Any] = {"metadata": {"aliases": aliases, "choices": choices, "nargs": nargs}}
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), **kwargs)
    return field(default=default, **kwargs)


def _require_positive(section: object, *names: str) -> None:
    for name in names:
        value = getattr(section, name)
        if value is not None and value <= 0:
            raise TrainConfigError(f"{name} must be positive, got {value}")


@dataclass(kw_only=True, slots=True)
class ModelConfig:
    """Model kind and shape (T5 adds the t5 section)."""

    model: str = flag("gpt", choices=MODEL_KINDS)
    """Model kind: gpt (decoder only) or t5 (encoder-decoder, span corruption on sentence-split data)."""
    num_layers: int = 12
    """Number of transformer blocks (T5: encoder blocks)."""
    hidden_size: int = 768
    """Width of the residual stream."""
    num_attention_heads: int = 12
    """Attention heads per block (hidden_size must divide by it)."""
    ffn_hidden_size: int | None = None
    """Width of the MLP; default 4 x hidden_size."""
    seq_length: int = 1024
    """Tokens per training sample."""
    max_position_embeddings: int | None = None
    """Rows of the learned position table; default seq_length."""
    vocab_size: int | None = None
    """Vocabulary size before padding; default the tokenizer's."""
    make_vocab_size_divisible_by: int = 128
    """Pad the vocabulary to a multiple of this times the tensor-parallel size (Megatron)."""
    hidden_dropout: float = 0.1
    """Dropout after attention and MLP and on the embeddings."""
    attention_dropout: float = 0.1
    """Dropout on the attention probabilities."""
    init_method_std: float = 0.02
    """Standard deviation of the normal weight init (output projections get std/sqrt(2*layers))."""
    layernorm_epsilon: float = 1e-5
    """LayerNorm epsilon."""

    def __post_init__(self) -> None:
        _require_positive(self, "num_layers", "hidden_size", "num_attention_heads", "ffn_hidden_size",
                          "seq_length", "max_position_embeddings", "vocab_size", "make_vocab_size_divisible_by")
        if self.hidden_size % self.num_attention_heads:
            raise TrainConfigError(f"hidden_size ({self.hidden_size}) is not divisible by "
                                   f"num_attention_heads ({self.num_attention_heads})")
        if self.ffn_hidden_size is None:
            self.ffn_hidden_size = 4 * self.hidden_size
        if self.max_position_embeddings is None:
            self.max_position_embeddings = self.seq_length
        if self.max_position_embeddings < self.seq_length:
            raise TrainConfigError(f"max_position_embeddings ({self.max_position_embeddings}) is smaller than "
                                   f"seq_length ({self.seq_length})")
        for name in ("hidden_dropout", "attention_dropout"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise TrainConfigError(f"{name} must be in [0, 1), got {getattr(self, name)}")


@dataclass(kw_only=True, slots=True)
class DataConfig:
    """Where the tokens come from and how they are split."""

    dataset: list[str] = flag([], nargs="+")
    """Dataset prefix(es) (PREFIX.bin/PREFIX.idx), equal weights (OneFlow spelling)."""
    data_path: list[str] = flag([], nargs="+")
    """Megatron blend: [W1] P1 [W2 P2 ...] (weights optional)."""
    split: str = "949,50,1"
    """Train,valid,test proportions of the documents."""
    data_cache_path: str | None = None
    """Directory for the sample index caches; default beside the data."""
    seed: int = 1234
    """Seed of the model init, the data shuffle and dropout."""
    tokenizer_type: str = "GPT2BPETokenizer"
    """Tokenizer kind (for the EOD id and the vocabulary size)."""
    vocab_file: str | None = None
    """Tokenizer vocabulary file."""
    merge_file: str | None = None
    """BPE merges file."""
    tokenizer_model: str | None = None
    """SentencePiece / HF tokenizer model file."""

    def __post_init__(self) -> None:
        if self.dataset and self.data_path:
            raise TrainConfigError("give either dataset or data_path, not both")

    @property
    def blend(self) -> tuple[list[str], list[float] | None]:
        """Prefixes and their weights (None = weight by size), from either spelling.

        Raises:
            TrainConfigError: no prefix given, or weights and prefixes do not alternate.
        """
        if self.dataset:
            return list(self.dataset), None
        if not self.data_path:
            raise TrainConfigError("no training data: give dataset or data_path")
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

    micro_batch_size: int = 1
    """Samples per forward pass on one data-parallel rank."""
    global_batch_size: int | None = None
    """Samples per optimiser step over all ranks; default micro x dp x accumulation."""
    num_accumulation_steps: int | None = None
    """Micro-batches per step per rank; derived from the global batch (accepted if consistent)."""
    train_iters: int = 100
    """Optimiser steps to train for."""
    device: str | None = flag(None, choices=("cpu", "cuda"))
    """Device kind; default cuda when available."""
    checkpoint_activations: bool = False
    """Recompute each block's activations in the backward pass (saves memory)."""

    def __post_init__(self) -> None:
        _require_positive(self, "micro_batch_size", "global_batch_size", "num_accumulation_steps", "train_iters")


@dataclass(kw_only=True, slots=True)
class PrecisionConfig:
    """Mixed precision (autocast over fp32 master weights)."""

    bf16: bool = False
    """Compute in bfloat16."""
    fp16: bool = False
    """Compute in float16 with dynamic loss scaling."""
    initial_loss_scale: float = DEFAULT_INITIAL_LOSS_SCALE
    """fp16: starting loss scale."""
    loss_scale_window: int = 1000
    """fp16: steps without overflow before the scale doubles."""
    hysteresis: int = 2
    """fp16: overflows tolerated before the scale halves."""
    min_loss_scale: float = 1.0
    """fp16: the scale never drops below this."""

    def __post_init__(self) -> None:
        if self.bf16 and self.fp16:
            raise TrainConfigError("bf16 and fp16 are mutually exclusive")
        _require_positive(self, "initial_loss_scale", "loss_scale_window", "hysteresis", "min_loss_scale")


@dataclass(kw_only=True, slots=True)
class OptimizerConfig:
    """AdamW and the learning-rate schedule."""

    optimizer: str = flag("adamw", choices=("adamw",))
    """Optimiser (biases and norms get no weight decay)."""
    lr: float = flag(1e-4, "--learning-rate")
    """Peak learning rate."""
    min_lr: float = 0.0
    """Learning rate at the end of the decay."""
    lr_decay_style: str = flag("cosine", choices=("constant", "linear", "cosine"))
    """Shape of the decay after warm-up."""
    lr_decay_iters: int | None = None
    """Steps over which the lr decays; default train_iters."""
    lr_warmup_iters: int = 0
    """Linear warm-up steps."""
    lr_warmup_fraction: float | None = None
    """Warm-up as a fraction of lr_decay_iters (instead of lr_warmup_iters)."""
    weight_decay: float = 0.01
    """AdamW decoupled weight decay."""
    adam_beta1: float = 0.9
    """AdamW beta1."""
    adam_beta2: float = 0.999
    """AdamW beta2."""
    adam_eps: float = 1e-8
    """AdamW epsilon."""
    clip_grad: float = 1.0
    """Clip the global gradient norm to this (0 = no clipping)."""

    def __post_init__(self) -> None:
        if self.lr_warmup_fraction is not None and self.lr_warmup_iters:
            raise TrainConfigError("give either lr_warmup_iters or lr_warmup_fraction, not both")
        if self.min_lr > self.lr:
            raise TrainConfigError(f"min_lr ({self.min_lr}) is larger than lr ({self.lr})")
        _require_positive(self, "lr", "lr_decay_iters")


@dataclass(kw_only=True, slots=True)
class ParallelismConfig:
    """How the model and the batch are divided over the processes."""

    tensor_model_parallel_size: int = 1
    """Tensor-parallel degree (heads, MLP and vocabulary sharded)."""
    pipeline_model_parallel_size: int = 1
    """Pipeline-parallel degree (layers split into stages)."""
    pipeline_schedule: str = flag("1f1b", choices=("1f1b", "gpipe", "interleaved"))
    """Pipeline schedule."""
    num_layers_per_virtual_pipeline_stage: int | None = None
    """Interleaved schedule: layers per model chunk."""
    sequence_parallel: bool = False
    """Shard norms and dropout along the sequence over the tensor-parallel ranks."""
    use_distributed_optimizer: bool = False
    """Shard parameters, gradients and optimiser state over data-parallel ranks (FSDP2)."""

    def __post_init__(self) -> None:
        _require_positive(self, "tensor_model_parallel_size", "pipeline_model_parallel_size",
                          "num_layers_per_virtual_pipeline_stage")
        if self.num_layers_per_virtual_pipeline_stage is not None and self.pipeline_schedule != "interleaved":
            raise TrainConfigError("num_layers_per_virtual_pipeline_stage needs pipeline_schedule interleaved")


@dataclass(kw_only=True, slots=True)
class LaunchConfig:
    """Processes and nodes (what torchrun would be told)."""

    num_gpus_per_node: int = flag(1, "--nproc-per-node")
    """Processes per node (GPUs, or CPU processes with device cpu)."""
    num_nodes: int = 1
    """Number of nodes."""
    node_rank: int = 0
    """Rank of this node."""
    master_addr: str = flag("127.0.0.1", "--node-ips")
    """Address of node 0 (a comma-separated node list: its first entry)."""
    master_port: int = 29500
    """Rendezvous port on node 0 (0 = any free port, single node only)."""

    def __post_init__(self) -> None:
        _require_positive(self, "num_gpus_per_node", "num_nodes")
        if self.master_port < 0 or (self.master_port == 0 and self.num_nodes > 1):
            raise TrainConfigError(f"master_port must be a port number (0 only on a single node), "
                                   f"got {self.master_port}")
        self.master_addr = self.master_addr.split(",")[0].strip()
        if not 0 <= self.node_rank < self.num_nodes:
            raise TrainConfigError(f"node_rank ({self.node_rank}) must be in [0, num_nodes={self.num_nodes})")


@dataclass(kw_only=True, slots=True)
class CheckpointConfig:
    """Saving and resuming."""

    save: str | None = None
    """Directory to save checkpoints into."""
    load: str | None = None
    """Directory to resume from (its latest checkpoint; a `convert-checkpoint --from-hf` one starts at step 0)."""
    load_hf: str | None = None
    """Hugging Face GPT-2, T5 or mT5 directory to start from (its shape and tokenizer files become the defaults)."""
    save_interval: int | None = None
    """Save every this many steps (and at the end); default only at the end."""

    def __post_init__(self) -> None:
        _require_positive(self, "save_interval")


@dataclass(kw_only=True, slots=True)
class LoggingConfig:
    """Log lines, metrics file, evaluation."""

    log_interval: int = 100
    """Log a training line every this many steps."""
    eval_interval: int = 1000
    """Evaluate on the valid split every this many steps."""
    eval_iters: int = 100
    """Global batches per evaluation (0 = no evaluation)."""
    tensorboard_dir: str | None = None
    """Also write TensorBoard scalars here (needs tensorboard installed)."""
    metrics_file: str | None = None
    """JSON-lines metrics; default <save>/metrics.jsonl, else ./metrics.jsonl."""

    def __post_init__(self) -> None:
        _require_positive(self, "log_interval", "eval_interval")
        if self.eval_iters < 0:
            raise TrainConfigError(f"eval_iters must be >= 0, got {self.eval_iters}")
        if self.tensorboard_dir is not None and importlib.util.find_spec("tensorboard") is None:
            raise TrainConfigError("tensorboard_dir needs the tensorboard package: pip install tensorboard")


@dataclass(kw_only=True, slots=True)
class T5Config:
    """T5 span-corruption pre-training (read with model t5; hidden_size, heads, ffn_hidden_size, layers from model)."""

    encoder_seq_length: int = 512
    """Encoder positions per sample."""
    decoder_seq_length: int = 128
    """Decoder positions per sample."""
    kv_channels: int | None = None
    """Channels per attention head (T5's d_kv); default hidden_size / num_attention_heads."""
    decoder_num_layers: int | None = None
    """Decoder blocks; default num_layers (the encoder's)."""
    vocab_extra_ids: int = 100
    """Sentinel tokens <extra_id_k> added to a vocabulary that has none."""
    feed_forward_proj: str = flag("relu", choices=FEED_FORWARD_KINDS)
    """MLP kind: relu (T5 v1.0) or gated-gelu (T5 v1.1, mT5)."""
    untie_embeddings_and_output_weights: bool = False
    """Separate LM head (v1.1, mT5); tied heads scale the decoder output by hidden_size**-0.5 (v1.0)."""
    relative_attention_num_buckets: int = 32
    """Relative position buckets of the attention bias (Megatron's and T5's default)."""
    relative_attention_max_distance: int = 128
    """Distance (positions) beyond which relative positions share the last bucket."""
    mask_prob: float = 0.15
    """Noise density: the fraction of a sample's tokens replaced by spans."""
    mean_noise_span_length: float = 3.0
    """Average tokens per noise span."""
    short_seq_prob: float = 0.1
    """Probability of a sample with a shorter random target length."""

    def __post_init__(self) -> None:
        for name in ("encoder_seq_length", "decoder_seq_length", "kv_channels", "decoder_num_layers",
                     "relative_attention_num_buckets", "relative_attention_max_distance"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise TrainConfigError(f"{name} must be >= 1, got {value}")
        if self.vocab_extra_ids < 0:
            raise TrainConfigError(f"vocab_extra_ids must be >= 0, got {self.vocab_extra_ids}")


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
    t5: T5Config = field(default_factory=T5Config)
