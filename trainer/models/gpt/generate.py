"""GPT generation: continue prompts with a tokenmill GPT checkpoint or a Hugging Face GPT-2 or Llama-class
directory (`trainer.models.gpt.hf_decoders`).

One process, or tp x pp x dp processes (under torchrun, ``generate --nproc-per-node N``, or a group the
caller set up): prompts are split over the data-parallel replicas, run in left-padded batches with a
KV cache (`trainer.generation.kv_cache`) through this rank's `trainer.models.gpt.sharded.ShardedGPT`,
and every rank returns every prompt's completion. A MoE GPT's experts may be sharded over ep of the
replicas, which then step together (`trainer.generation.layout`).

    completions = generate_gpt(GenerateConfig(load="gpt2/", prompts=["Hello, my name is"], max_new_tokens=20,
                                              sampling=SamplingConfig(greedy=True)))
"""

from __future__ import annotations

import logging
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
from trainer.generation.kv_cache import KVCache
from trainer.generation.layout import GenerationLayout, finished_everywhere
from trainer.generation.replicas import map_over_replicas
from trainer.generation.sampling import SamplingConfig, next_tokens
from trainer.checkpoint.hf_files import is_hf_directory, read_hf_config
from trainer.models.gpt.convert import load_hf_weights, read_model_config
from trainer.models.gpt.hf_decoders import check_decoder_config, decoder_shape, hf_eos_id
from trainer.models.gpt.model import GPTShape
from trainer.models.gpt.sharded import ShardedGPT, sharded_layout
from trainer.parallel.dims import pad_vocab_size

logger = logging.getLogger(__name__)

# Id written into the left padding of a batch; masked out of attention, so any valid id works.
PAD_TOKEN_ID = 0


@dataclass(frozen=True, slots=True)
class GPTSource:
    """Where the weights come from and what the model is (what generation and evaluation load)."""

    directory: Path
    """The HF directory, or the checkpoint root (where tokenizer files are looked for)."""
    shape: GPTShape
    vocab_size: int
    eod_id: int | None
    iteration: int | None
    """The checkpoint's iteration; None for a HF directory."""

    @property
    def max_positions(self) -> int:
        return self.shape.max_position_embeddings

    def layout(self, tp: int, pp: int, world_size: int, ep: int = 1) -> GenerationLayout:
        """`sharded_layout` of this model (raises `TrainConfigError` for a size that does not divide)."""
        return sharded_layout(self.shape, tp, pp, world_size, ep)

    def open_sharded(self, layout: GenerationLayout, device_type: str, device: torch.device, verify: bool
                     ) -> ShardedGPT:
        """This rank's part of the model in ``layout``, its weights loaded and ready to decode and score
        (collective over the process group when there is one)."""
        model = ShardedGPT(self.shape, self.vocab_size, layout, layout.build_mesh(device_type), device)
        if self.iteration is None:
            load_hf_weights(model.named_parameters(), self.directory, self.shape)
        else:
            load_checkpoint(self.directory, self.iteration,
                            {MODEL_PREFIX + name: p.detach() for name, p in model.named_parameters()}, verify=verify)
        model.finish_loading()
        return model

    def generate_ids(self, model: ShardedGPT, prompts: list[list[int]], max_new_tokens: int,
                     sampling: SamplingConfig, eod_id: int | None, generator: torch.Generator | None
                     ) -> list[list[int]]:
        """`generate_ids` with ``model`` (the evaluation's ``generate_until``)."""
        return generate_ids(model, prompts, max_new_tokens, sampling, eod_id, generator)


def resolve_gpt_source(path: str, tp: int) -> GPTSource:
    """The model of ``path``, a HF GPT-2 or Llama-class directory or a GPT checkpoint (root or iter_XXXXXXX directory); a HF
    vocabulary is padded only as far as ``tp`` shards need.

    Raises:
        HFConversionError: the directory's config is not a GPT-2 we convert.
        CheckpointError: the checkpoint has no model config.
    """
    if is_hf_directory(path):
        config = read_hf_config(path)
        check_decoder_config(config, f"{path}/config.json")
        # No training layout to match: pad only as far as the tp shards need.
        shape = decoder_shape(config, pad_vocab_size(config["vocab_size"], 1, tp))
        return GPTSource(Path(path), shape, config["vocab_size"], hf_eos_id(config), iteration=None)
    root, iteration = resolve_checkpoint(path)
    model = read_model_config(root)
    if model is None:
        raise CheckpointError(f"{root} has no {MODEL_CONFIG_FILE}, so its head count and vocabulary size are unknown: "
                              f"export it with convert-checkpoint --from {root} --to-hf DIR --num-attention-heads N "
                              "--vocab-size V and generate from DIR")
    return GPTSource(root, model.shape, model.vocab_size, model.eod_id, iteration)


def left_pad(prompts: list[list[int]], device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Left-padded tokens, their real-token mask and position ids, each [batch, longest prompt].

    Positions count from 0 at each row's first real token (padding gets 0), as in an unpadded run.
    """
    longest = max(len(p) for p in prompts)
    tokens = torch.full((len(prompts), longest), PAD_TOKEN_ID, dtype=torch.int64)
    mask = torch.zeros(len(prompts), longest, dtype=torch.bool)
    for row, ids in enumerate(prompts):
        tokens[row, longest - len(ids):] = torch.tensor(ids, dtype=torch.int64)
        mask[row, longest - len(ids):] = True
    positions = (mask.long().cumsum(dim=1) - 1).clamp(min=0)
    return tokens.to(device), mask.to(device), positions.to(device)


def generate_ids(model: ShardedGPT, prompts: list[list[int]], max_new_tokens: int, sampling: SamplingConfig,
                 eod_id: int | None, generator: torch.Generator | None) -> list[list[int]]:
    """Continue one batch of prompts (collective over the model's tp/pp ranks and its ep group: the batch
    decodes until the group's every row is done).

    Args:
        model: this rank's part of the model.
        prompts: token ids of each prompt (lengths may differ).
        max_new_tokens: most tokens generated per prompt.
        sampling: how the next token is chosen.
        eod_id: a row stops after generating this id (None: never stops early).
        generator: random source of sampling (seeded identically on every tp rank).

    Returns:
        The generated ids of each prompt, ending with ``eod_id`` when it stopped there.
    """
    tokens, mask, positions = left_pad(prompts, model.device)
    lengths = mask.sum(dim=1)
    cache = KVCache(mask, max_length=tokens.shape[1] + max_new_tokens)
    done = torch.zeros(len(prompts), dtype=torch.bool, device=model.device)
    generated: list[torch.Tensor] = []
    choose = lambda logits: next_tokens(logits, sampling, generator)  # noqa: E731
    step_tokens, step_positions = tokens, positions
    for step in range(max_new_tokens):
        chosen = model.next_tokens(step_tokens, step_positions, cache.step(step_tokens.shape[1]), choose)
        generated.append(chosen)
        if eod_id is not None:
            done |= chosen == eod_id
        if finished_everywhere(done, model.ep_group):
            break
        step_tokens, step_positions = chosen[:, None], (lengths + step)[:, None]
    table = torch.stack(generated, dim=1).tolist()
    out = []
    for row in table:
        cut = row.index(eod_id) + 1 if eod_id in row else len(row)
        out.append(row[:cut])
    return out


def _check_positions(prompts: list[list[int]], max_new_tokens: int, limit: int) -> None:
    # The last generated token is never fed back, so the largest position used is len + new - 2.
    longest = max(len(p) for p in prompts)
    if longest + max_new_tokens - 1 > limit:
        raise TrainConfigError(f"a prompt of {longest} tokens plus max_new_tokens {max_new_tokens} exceeds the "
                               f"model's {limit} positions")


def _tokenize(config: GenerateConfig, source: GPTSource) -> tuple[Tokenizer | None, list[str | list[int]],
                                                               list[list[int]]]:
    tokenizer = prompt_tokenizer(config, source.directory)
    given: list[str | list[int]] = [*config.prompts, *config.prompt_ids]
    ids = encode_prompts(tokenizer, config.prompts) + [list(p) for p in config.prompt_ids]
    if any(not p for p in ids):
        raise TrainConfigError("a prompt encodes to no tokens")
    return tokenizer, given, ids


@dataclass(frozen=True, slots=True)
class GenerationPlan:
    """Everything checked before the first collective: model, tokenizer, prompts, layout."""

    source: GPTSource
    tokenizer: Tokenizer | None
    given: list[str | list[int]]
    prompt_ids: list[list[int]]
    eod_id: int | None
    layout: GenerationLayout


def plan_generation(config: GenerateConfig, world_size: int) -> GenerationPlan:
    """Resolve and check a run on ``world_size`` processes without touching a process group.

    Raises:
        TokenmillError: the model, tokenizer, prompts or layout are wrong (one clear message).
    """
    source = resolve_gpt_source(config.load, config.tensor_model_parallel_size)
    tokenizer, given, prompt_ids = _tokenize(config, source)
    largest, smallest = max(max(p) for p in prompt_ids), min(min(p) for p in prompt_ids)
    if largest >= source.vocab_size or smallest < 0:
        raise TrainConfigError(f"prompt token ids must be in [0, {source.vocab_size}) (the model's vocabulary); "
                               f"found {largest if largest >= source.vocab_size else smallest}")
    _check_positions(prompt_ids, config.max_new_tokens, source.shape.max_position_embeddings)
    layout = source.layout(config.tensor_model_parallel_size, config.pipeline_model_parallel_size, world_size,
                           config.expert_model_parallel_size)
    eod_id = tokenizer.eod if tokenizer is not None else source.eod_id
    return GenerationPlan(source, tokenizer, given, prompt_ids, eod_id, layout)


def _generate_here(config: GenerateConfig, plan: GenerationPlan, device_type: str,
                   device: torch.device) -> list[list[int]]:
    """This rank's share: its data-parallel replica's prompts (and fillers, under expert parallelism), then
    every replica's results."""
    layout, prompt_ids = plan.layout, plan.prompt_ids
    model = plan.source.open_sharded(layout, device_type, device, verify=not config.no_verify)
    generator = torch.Generator(device=device).manual_seed(config.seed)
    count = len(prompt_ids)
    logger.info("generating for %d prompts (tp %d, pp %d, dp %d, ep %d)", count, layout.tp, layout.pp, layout.dp,
                layout.ep)

    def run_batch(indices: list[int]) -> list[list[int]]:
        return generate_ids(model, [prompt_ids[i] for i in indices], config.max_new_tokens,
                            config.sampling, plan.eod_id, generator)

    return map_over_replicas(count, config.batch_size, model.dp_rank, layout.dp, model.dp_group, run_batch,
                             lockstep=layout.ep > 1)


def generate_gpt(config: GenerateConfig) -> list[Completion]:
    """Generate a continuation of every prompt with a GPT (collective: every process of the group calls it).

    Returns:
        One `Completion` per prompt, in order (texts first, then id prompts), on every rank.

    Raises:
        TokenmillError: a missing/mismatched model, tokenizer or layout (one clear message), raised
            on every rank before the first collective.
    """
    device_type = resolve_device_type(config.device)
    ctx = init_distributed(device_type)
    try:
        plan = plan_generation(config, ctx.world_size)
        results = _generate_here(config, plan, device_type, ctx.device)
    finally:
        if ctx.owns_process_group:
            dist.destroy_process_group()
    completions = []
    for index, prompt in enumerate(plan.given):
        ids = results[index]
        text = None
        if plan.tokenizer is not None:
            text = plan.tokenizer.decode(ids[:-1] if ids and ids[-1] == plan.eod_id else ids)
        completions.append(Completion(prompt=prompt, text=text, ids=ids))
    return completions


def check_gpt_generation(config: GenerateConfig, world_size: int) -> None:
    """`plan_generation`'s checks, for ``generate`` to fail before it starts any process."""
    plan_generation(config, world_size)
