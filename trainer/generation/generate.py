"""``generate``: continue prompts with a checkpoint or a Hugging Face directory of any model family.

The run's config and result, and what every family's generation shares (prompt tokenizer and encoding);
the family of the source generates (its `trainer.family.spec.ModelSpec.generate`), found by
`trainer.models.dispatch.generate`. Collective: under torchrun (or ``generate --nproc-per-node N``) every rank
calls `generate` and every rank gets every completion.

    from trainer.generation.generate import GenerateConfig
    from trainer.models.dispatch import generate
    from trainer.generation.sampling import SamplingConfig
    completions = generate(GenerateConfig(load="gpt2/", prompts=["Hello, my name is"], max_new_tokens=20,
                                          sampling=SamplingConfig(greedy=True)))
    completions[0].text, completions[0].ids
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from preprocess.tokenizers import Tokenizer, TokenizerConfig, build_tokenizer
from trainer.errors import TrainConfigError
from trainer.generation.sampling import SamplingConfig
from trainer.checkpoint.hf_files import tokenizer_config_for_directory


@dataclass(kw_only=True, slots=True)
class GenerateConfig:
    """One generation run."""

    load: str
    """A tokenmill checkpoint (root or iter_XXXXXXX directory) or a local HF GPT-2 directory."""
    no_verify: bool = False
    """Load without checking the checkpoint's files against its manifest (checksums written at save)."""
    prompts: list[str] = field(default_factory=list)
    """Prompt texts (need a tokenizer)."""
    prompt_ids: list[list[int]] = field(default_factory=list)
    """Prompts given as token ids (after the texts)."""
    tokenizer: TokenizerConfig | None = None
    """Default: the tokenizer files stored with the model, if any."""
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    max_new_tokens: int = 32
    """Tokens generated per prompt at most (fewer when EOD comes first)."""
    seed: int = 1234
    """Seed of the sampling generator."""
    batch_size: int = 16
    """Prompts per forward pass on one data-parallel replica."""
    tensor_model_parallel_size: int = 1
    pipeline_model_parallel_size: int = 1
    expert_model_parallel_size: int = 1
    """Ranks each MoE layer's experts are sharded over: that many data-parallel replicas, each generating its
    own prompts, exchange tokens with the experts' ranks (`trainer.generation.layout`). Divides the experts and
    the data-parallel size; 1 (every rank holds every expert) for a dense model."""
    device: str | None = None
    """cpu or cuda; default cuda when available."""

    def __post_init__(self) -> None:
        for name in ("max_new_tokens", "batch_size", "tensor_model_parallel_size", "pipeline_model_parallel_size",
                     "expert_model_parallel_size"):
            if getattr(self, name) < 1:
                raise TrainConfigError(f"{name} must be positive, got {getattr(self, name)}")
        if not self.prompts and not self.prompt_ids:
            raise TrainConfigError("no prompt given")
        if any(not ids for ids in self.prompt_ids):
            raise TrainConfigError("a prompt given as token ids is empty")


@dataclass(slots=True)
class Completion:
    """One prompt's continuation."""

    prompt: str | list[int]
    text: str | None
    """The generated ids decoded (EOD left out); None without a tokenizer."""
    ids: list[int]
    """Generated token ids; the last is the EOD id when generation stopped there."""


def prompt_tokenizer(config: GenerateConfig, directory: str | os.PathLike) -> Tokenizer | None:
    """The tokenizer of a run: its options, else the tokenizer files stored in ``directory`` (a HF
    directory or a checkpoint root); None when there is neither and every prompt is given as ids.

    Raises:
        TrainConfigError: text prompts without a tokenizer.
    """
    tokenizer_config = config.tokenizer or tokenizer_config_for_directory(directory)
    if config.prompts and tokenizer_config is None:
        raise TrainConfigError(f"text prompts need a tokenizer: {config.load} holds no tokenizer files; "
                               "give the tokenizer options or prompts as token ids")
    return build_tokenizer(tokenizer_config) if tokenizer_config is not None else None


def encode_prompts(tokenizer: Tokenizer, prompts: list[str]) -> list[list[int]]:
    """The token ids of each text prompt.

    Raises:
        TrainConfigError: a prompt the tokenizer cannot encode (NullTokenizer: not integers, or an id past
            its vocabulary), naming the prompt.
    """
    ids = []
    for number, text in enumerate(prompts, start=1):
        try:
            ids.append(tokenizer.encode(text))
        except ValueError as error:
            raise TrainConfigError(f"prompt {number}: {error}") from None
    return ids
