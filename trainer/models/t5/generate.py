"""Encoder-decoder generation with T5/mT5 (and Switch Transformers, its mixture of experts): `generate_t5`, what
``generate --load T5_DIR_OR_CHECKPOINT`` runs, in one process or split over tp x pp x dp processes (experts
sharded over ep of the dp replicas), and `greedy_generate`/`sample_t5` for a `T5` in hand.

    completions = generate_t5(GenerateConfig(load="t5-small/", prompt_ids=[[13, 8, 1]], max_new_tokens=20))
    ids = greedy_generate(model, encoder_input_ids, max_new_tokens=32, decoder_start_id=0, eos_id=1, pad_id=0)

The encoder runs once per batch; the decoder runs incrementally with a key/value cache (self-attention
keys grow by one position per step, cross-attention keys are computed once). A sequence that produced
EOS is continued with the pad id until every sequence is done or ``max_new_tokens`` is reached.

Split over processes (under torchrun, ``generate --nproc-per-node N``, or a group the caller set up),
the prompts are divided over the data-parallel replicas (`trainer.generation.replicas`), and each
replica runs its batches through its ranks' `trainer.models.t5.sharded.ShardedT5` (pipeline stages of
encoder and/or decoder blocks, tensor-parallel, experts sharded over the ep group); every rank returns every
prompt's completion. The replicas of an ep group step together (`trainer.generation.layout`).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from preprocess.tokenizers import Tokenizer
from trainer.checkpoint.load import load_checkpoint
from trainer.checkpoint.store import MODEL_CONFIG_FILE, MODEL_PREFIX, resolve_checkpoint
from trainer.parallel.distributed import init_distributed, resolve_device_type
from trainer.errors import CheckpointError, TrainConfigError
from trainer.generation.generate import Completion, GenerateConfig, encode_prompts, prompt_tokenizer
from trainer.generation.layout import GenerationLayout, finished_everywhere
from trainer.generation.replicas import map_over_replicas
from trainer.generation.sampling import next_tokens
from trainer.checkpoint.hf_files import read_hf_config, tokenizer_config_for_directory
from trainer.models.t5.config import t5_text_tokenizer_for
from trainer.models.t5.convert import load_hf_t5_weights, read_t5_model_config
from trainer.models.t5.hf import is_hf_t5_directory, load_hf_t5
from trainer.models.t5.model import T5, T5Shape
from trainer.models.t5.sharded import ShardedT5, sharded_t5_layout
from trainer.parallel.dims import pad_vocab_size

logger = logging.getLogger(__name__)

# T5/mT5's own ids, what Hugging Face configs default to when they leave them out.
DEFAULT_EOS_ID = 1
DEFAULT_PAD_ID = 0


def decode_loop(step: Callable[[torch.Tensor], torch.Tensor], batch: int, max_new_tokens: int, decoder_start_id: int,
                eos_id: int | None, pad_id: int, device: torch.device,
                finished: Callable[[torch.Tensor], bool] = lambda done: bool(done.all())) -> torch.Tensor:
    """Decoder ids [batch, 1 + generated] from ``decoder_start_id``, each next column ``step(ids so far)``.

    A row that produced ``eos_id`` gets ``pad_id`` afterwards; the loop stops once ``finished(done)``
    (bool [batch] rows done; default: every row has, never early when ``eos_id`` is None) or after
    ``max_new_tokens`` tokens.
    """
    ids = torch.full((batch, 1), decoder_start_id, dtype=torch.int64, device=device)
    done = torch.zeros(batch, dtype=torch.bool, device=device)
    for _ in range(max_new_tokens):
        next_ids = step(ids).masked_fill(done, pad_id)
        ids = torch.cat([ids, next_ids[:, None]], dim=1)
        if eos_id is not None:
            done |= next_ids == eos_id
        if finished(done):
            break
    return ids


@torch.no_grad()
def sample_t5(model: T5, encoder_input_ids: torch.Tensor, max_new_tokens: int, decoder_start_id: int, eos_id: int,
              pad_id: int, choose: Callable[[torch.Tensor], torch.Tensor],
              encoder_attention_mask: torch.Tensor | None = None, use_cache: bool = True) -> torch.Tensor:
    """Decoder ids [batch, 1 + generated] of a whole `T5` in this process, each next id ``choose(logits)``.

    Args:
        model: the model (evaluation mode is the caller's choice; dropout is off only in eval()).
        encoder_input_ids: int64 [batch, Le].
        max_new_tokens: most tokens generated after the start id.
        decoder_start_id: first decoder token (T5/mT5: the pad id).
        eos_id: end of sequence; a sequence stops after it.
        pad_id: fills the positions after a sequence's EOS.
        choose: float logits [batch, vocab] -> int64 ids [batch].
        encoder_attention_mask: [batch, Le], 1 token, 0 padding; None: no padding.
        use_cache: decode incrementally (False recomputes the whole prefix each step; same result).
    """
    memory = model.encode(encoder_input_ids, encoder_attention_mask)
    cache: dict | None = {} if use_cache else None

    def step(ids: torch.Tensor) -> torch.Tensor:
        fed = ids[:, -1:] if use_cache else ids
        return choose(model.decode(fed, memory, encoder_attention_mask, cache)[:, -1])

    return decode_loop(step, encoder_input_ids.shape[0], max_new_tokens, decoder_start_id, eos_id, pad_id,
                       encoder_input_ids.device)


def greedy_generate(model: T5, encoder_input_ids: torch.Tensor, max_new_tokens: int, decoder_start_id: int,
                    eos_id: int, pad_id: int, encoder_attention_mask: torch.Tensor | None = None,
                    use_cache: bool = True) -> torch.Tensor:
    """`sample_t5` taking the most likely token at every step (what HF ``generate(do_sample=False)`` does)."""
    return sample_t5(model, encoder_input_ids, max_new_tokens, decoder_start_id, eos_id, pad_id,
                     lambda logits: logits.argmax(dim=-1), encoder_attention_mask, use_cache)


def right_pad(prompts: list[list[int]], pad_id: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Encoder ids padded on the right with ``pad_id`` and their mask (1 token, 0 padding), int64 [batch, longest]."""
    longest = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), longest), pad_id, dtype=torch.int64)
    mask = torch.zeros_like(ids)
    for row, prompt in enumerate(prompts):
        ids[row, :len(prompt)] = torch.tensor(prompt, dtype=torch.int64)
        mask[row, :len(prompt)] = 1
    return ids.to(device), mask.to(device)


@dataclass(frozen=True, slots=True)
class SpecialIds:
    """The ids generation starts, stops and pads with."""

    decoder_start: int
    eos: int | None
    """None: never stop early."""
    pad: int


def generate_ids(model: ShardedT5, prompts: list[list[int]], max_new_tokens: int,
                 choose: Callable[[torch.Tensor], torch.Tensor], special: SpecialIds) -> list[list[int]]:
    """Continue one batch of encoder prompts (collective over the model's tp/pp ranks and its ep group: the
    batch decodes until the group's every row is done).

    Args:
        model: this rank's part of the model.
        prompts: encoder token ids of each prompt (lengths may differ; right-padded).
        max_new_tokens: most tokens generated per prompt.
        choose: float logits [batch, vocab] -> int64 tokens [batch] (seeded identically on every tp rank).
        special: start, EOS and pad ids.

    Returns:
        The generated ids of each prompt (after the start id), ending with EOS when it stopped there.
    """
    encoder_ids, mask = right_pad(prompts, special.pad, model.device)
    state = model.encode(encoder_ids, mask, max_length=max_new_tokens)
    ids = decode_loop(lambda so_far: model.next_tokens(so_far[:, -1:], state, choose), len(prompts), max_new_tokens,
                      special.decoder_start, special.eos, special.pad, model.device,
                      lambda done: finished_everywhere(done, model.ep_group))
    out = []
    for row in ids[:, 1:].tolist():
        out.append(row[:row.index(special.eos) + 1] if special.eos in row else row)
    return out


@dataclass(frozen=True, slots=True)
class T5Source:
    """Where the weights come from and what the model is."""

    directory: Path
    """The HF directory, or the checkpoint root (where tokenizer files are looked for)."""
    shape: T5Shape
    """Vocabulary padded: as the checkpoint holds it, or (HF) as far as the tp shards need."""
    vocab_size: int
    special: SpecialIds
    iteration: int | None
    """The checkpoint's iteration; None for a HF directory."""


def resolve_t5_source(path: str, tp: int) -> T5Source:
    """The model of ``path``, a HF T5/mT5 directory or a T5 checkpoint (root or iter_XXXXXXX directory).

    Raises:
        HFConversionError: the directory is not a T5/mT5.
        CheckpointError: the checkpoint has no T5 model config.
    """
    if is_hf_t5_directory(path):
        config = read_hf_config(path)
        shape = load_hf_t5(path).shape  # whether the head is tied shows in the weights, not the config
        pad = config.get("pad_token_id", DEFAULT_PAD_ID)
        special = SpecialIds(config.get("decoder_start_token_id", pad), config.get("eos_token_id", DEFAULT_EOS_ID), pad)
        # No training layout to match: pad only as far as the tp shards need.
        padded = dataclasses.replace(shape, vocab_size=pad_vocab_size(shape.vocab_size, 1, tp))
        return T5Source(Path(path), padded, shape.vocab_size, special, iteration=None)
    root, iteration = resolve_checkpoint(path)
    info = read_t5_model_config(root)
    if info is None:
        raise CheckpointError(f"{root} has no T5 {MODEL_CONFIG_FILE}")
    # T5 starts decoding with the pad id (HF's decoder_start_token_id), as export writes it.
    special = SpecialIds(info["pad_id"], info["eos_id"], info["pad_id"])
    return T5Source(root, info["shape"], info["vocab_size"], special, iteration)


def _load_weights(model: ShardedT5, source: T5Source, verify: bool) -> None:
    if source.iteration is None:
        load_hf_t5_weights(model.named_parameters(), source.directory, source.shape)
        return
    load_checkpoint(source.directory, source.iteration,
                    {MODEL_PREFIX + name: p.detach() for name, p in model.named_parameters()}, verify=verify)


@dataclass(frozen=True, slots=True)
class T5GenerationPlan:
    """Everything checked before the first collective: model, tokenizer, prompts, layout."""

    source: T5Source
    tokenizer: Tokenizer | None
    given: list[str | list[int]]
    prompt_ids: list[list[int]]
    layout: GenerationLayout


def plan_t5_generation(config: GenerateConfig, world_size: int) -> T5GenerationPlan:
    """Resolve and check a run on ``world_size`` processes without touching a process group.

    Text prompts are encoded and end with EOS (as T5Tokenizer does); id prompts are used as given.

    Raises:
        TokenmillError: the model, tokenizer, prompts or layout are wrong (one clear message).
    """
    source = resolve_t5_source(config.load, config.tensor_model_parallel_size)
    tokenizer = prompt_tokenizer(config, source.directory)
    if tokenizer is not None:  # sentinels and special tokens read and written by name (issue 15 §1)
        stored = config.tokenizer or tokenizer_config_for_directory(source.directory)
        tokenizer = t5_text_tokenizer_for(tokenizer, stored, source.vocab_size,
                                          source.directory if source.iteration is None else None)
    eos = [] if source.special.eos is None else [source.special.eos]
    prompt_ids = [ids + eos for ids in encode_prompts(tokenizer, config.prompts)] + [list(p) for p in config.prompt_ids]
    if any(not p or min(p) < 0 or max(p) >= source.vocab_size for p in prompt_ids):
        raise TrainConfigError(f"every prompt needs token ids in [0, {source.vocab_size}) (the model's vocabulary)")
    layout = sharded_t5_layout(source.shape, config.tensor_model_parallel_size, config.pipeline_model_parallel_size,
                               world_size, config.expert_model_parallel_size)
    return T5GenerationPlan(source, tokenizer, [*config.prompts, *config.prompt_ids], prompt_ids, layout)


def check_t5_generation(config: GenerateConfig, world_size: int) -> None:
    """`plan_t5_generation`'s checks, for ``generate`` to fail before it starts any process."""
    plan_t5_generation(config, world_size)


def _generate_here(config: GenerateConfig, plan: T5GenerationPlan, device_type: str,
                   device: torch.device) -> list[list[int]]:
    """This rank's share: its data-parallel replica's prompts (and fillers, under expert parallelism), then
    every replica's results."""
    layout, source = plan.layout, plan.source
    model = ShardedT5(source.shape, source.vocab_size, layout, layout.build_mesh(device_type), device)
    _load_weights(model, source, verify=not config.no_verify)
    model.finish_loading()
    generator = torch.Generator(device=device).manual_seed(config.seed)
    choose = lambda logits: next_tokens(logits, config.sampling, generator)  # noqa: E731
    count = len(plan.prompt_ids)
    logger.info("generating for %d prompts (tp %d, pp %d, dp %d, ep %d)", count, layout.tp, layout.pp, layout.dp,
                layout.ep)

    def run_batch(indices: list[int]) -> list[list[int]]:
        return generate_ids(model, [plan.prompt_ids[i] for i in indices], config.max_new_tokens,
                            choose, source.special)

    return map_over_replicas(count, config.batch_size, model.dp_rank, layout.dp, model.dp_group, run_batch,
                             lockstep=layout.ep > 1)


def generate_t5(config: GenerateConfig) -> list[Completion]:
    """Generate with a T5/mT5 (collective: every process of the group calls it): ``generate --load T5_DIR``
    (a local Hugging Face T5/mT5 directory) or ``generate --load CHECKPOINT`` (a ``train --model t5``
    checkpoint), in one process or tp x pp x dp (experts sharded over ep of the dp replicas).

    A completion's ids are the generated decoder ids (after the start id), ending with EOS when it
    stopped there. The tokenizer comes from the options, else from the directory's files.

    Returns:
        One `Completion` per prompt, in order (texts first, then id prompts), on every rank.

    Raises:
        TokenmillError: a missing/mismatched model, tokenizer, prompt or layout (one clear message),
            raised on every rank before the first collective.
    """
    device_type = resolve_device_type(config.device)
    ctx = init_distributed(device_type)
    try:
        plan = plan_t5_generation(config, ctx.world_size)
        results = _generate_here(config, plan, device_type, ctx.device)
    finally:
        if ctx.owns_process_group:
            dist.destroy_process_group()
    eos = plan.source.special.eos
    completions = []
    for index, prompt in enumerate(plan.given):
        ids = results[index]
        text = None
        if plan.tokenizer is not None:
            text = plan.tokenizer.decode(ids[:-1] if ids and ids[-1] == eos else ids)
        completions.append(Completion(prompt=prompt, text=text, ids=ids))
    return completions
