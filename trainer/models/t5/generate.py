"""Encoder-decoder generation with a `trainer.models.t5.model.T5`: greedy (what HF ``generate(do_sample=False)``
does) or sampled, and `generate_t5`, what ``generate --load T5_DIR_OR_CHECKPOINT`` runs.

    ids = greedy_generate(model, encoder_input_ids, max_new_tokens=32, decoder_start_id=0, eos_id=1, pad_id=0)
    completions = generate_t5(GenerateConfig(load="t5-small/", prompt_ids=[[13, 8, 1]], max_new_tokens=20))

The encoder runs once; the decoder runs incrementally with a key/value cache (self-attention keys
grow by one position per step, cross-attention keys are computed once). A sequence that produced
EOS is continued with the pad id until every sequence is done or ``max_new_tokens`` is reached.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from preprocess.tokenizers import build_tokenizer
from trainer.distributed import resolve_device_type
from trainer.errors import TrainConfigError
from trainer.generate import Completion, GenerateConfig
from trainer.generation.sampling import next_tokens
from trainer.checkpoint import resolve_checkpoint
from trainer.hf_files import read_hf_config, tokenizer_config_for_directory
from trainer.models.t5.hf import is_hf_t5_directory, load_hf_t5
from trainer.models.t5.convert import load_t5_checkpoint
from trainer.models.t5.model import T5


@torch.no_grad()
def sample_t5(model: T5, encoder_input_ids: torch.Tensor, max_new_tokens: int, decoder_start_id: int, eos_id: int,
              pad_id: int, choose: Callable[[torch.Tensor], torch.Tensor],
              encoder_attention_mask: torch.Tensor | None = None, use_cache: bool = True) -> torch.Tensor:
    """Decoder ids [batch, 1 + generated] starting with ``decoder_start_id``, each next id ``choose(logits)``.

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
    batch = encoder_input_ids.shape[0]
    ids = torch.full((batch, 1), decoder_start_id, dtype=torch.long, device=encoder_input_ids.device)
    done = torch.zeros(batch, dtype=torch.bool, device=ids.device)
    cache: dict | None = {} if use_cache else None
    for _ in range(max_new_tokens):
        step_input = ids[:, -1:] if use_cache else ids
        logits = model.decode(step_input, memory, encoder_attention_mask, cache)[:, -1]
        next_ids = choose(logits).masked_fill(done, pad_id)
        ids = torch.cat([ids, next_ids[:, None]], dim=1)
        done |= next_ids == eos_id
        if done.all():
            break
    return ids


def greedy_generate(model: T5, encoder_input_ids: torch.Tensor, max_new_tokens: int, decoder_start_id: int,
                    eos_id: int, pad_id: int, encoder_attention_mask: torch.Tensor | None = None,
                    use_cache: bool = True) -> torch.Tensor:
    """`sample_t5` taking the most likely token at every step."""
    return sample_t5(model, encoder_input_ids, max_new_tokens, decoder_start_id, eos_id, pad_id,
                     lambda logits: logits.argmax(dim=-1), encoder_attention_mask, use_cache)


def _right_pad(prompts: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Encoder ids padded on the right with ``pad_id`` and their mask (1 token, 0 padding), int64 [batch, longest]."""
    longest = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), longest), pad_id, dtype=torch.int64)
    mask = torch.zeros_like(ids)
    for row, prompt in enumerate(prompts):
        ids[row, :len(prompt)] = torch.tensor(prompt, dtype=torch.int64)
        mask[row, :len(prompt)] = 1
    return ids, mask


@dataclass(frozen=True)
class _T5Source:
    """A T5 to generate with, its special ids, real vocabulary size and the directory of its files."""

    model: T5
    eos_id: int
    pad_id: int
    start_id: int
    vocab_size: int
    directory: Path


def _load_source(path: str, verify: bool) -> _T5Source:
    if is_hf_t5_directory(path):
        hf_config = read_hf_config(path)
        model = load_hf_t5(path)
        eos_id, pad_id = hf_config.get("eos_token_id", 1), hf_config.get("pad_token_id", 0)
        return _T5Source(model, eos_id, pad_id, hf_config.get("decoder_start_token_id", pad_id),
                         hf_config.get("vocab_size", model.shape.vocab_size), Path(path))
    root, iteration = resolve_checkpoint(path)
    model, info = load_t5_checkpoint(root, iteration, verify)
    # T5 starts decoding with the pad id (HF's decoder_start_token_id), as export writes it.
    return _T5Source(model, info["eos_id"], info["pad_id"], info["pad_id"], info["vocab_size"], root)


def generate_t5(config: GenerateConfig) -> list[Completion]:
    """Generate with a T5 in this process: ``generate --load T5_DIR`` (a local Hugging Face T5/mT5
    directory) or ``generate --load CHECKPOINT`` (a ``train --model t5`` checkpoint).

    Text prompts are encoded and end with EOS (as T5Tokenizer does); id prompts are used as given.
    A completion's ids are the generated decoder ids (after the start id), ending with EOS when it
    stopped there. The tokenizer comes from the options, else from the directory's files.

    Raises:
        TrainConfigError: a parallel layout was asked for, a text prompt without a tokenizer, or ids
            outside the vocabulary.
        HFConversionError: the directory is not a T5/mT5.
        CheckpointError: the checkpoint is not a T5's, or damaged.
    """
    if config.tensor_model_parallel_size * config.pipeline_model_parallel_size != 1:
        raise TrainConfigError("T5 generation runs in one process: tensor/pipeline parallel sizes must be 1")
    source = _load_source(config.load, verify=not config.no_verify)
    eos_id, pad_id, start_id, vocab_size = source.eos_id, source.pad_id, source.start_id, source.vocab_size
    tokenizer_config = config.tokenizer or tokenizer_config_for_directory(source.directory)
    if config.prompts and tokenizer_config is None:
        raise TrainConfigError(f"text prompts need a tokenizer: {config.load} holds no tokenizer files; "
                               "give the tokenizer options or prompts as token ids")
    tokenizer = build_tokenizer(tokenizer_config) if tokenizer_config is not None else None
    prompts = [tokenizer.encode(text) + [eos_id] for text in config.prompts] + [list(p) for p in config.prompt_ids]
    device = torch.device(resolve_device_type(config.device))
    model = source.model.eval().to(device)
    if any(not p or min(p) < 0 or max(p) >= vocab_size for p in prompts):
        raise TrainConfigError(f"every prompt needs token ids in [0, {vocab_size}) (the model's vocabulary)")
    generator = torch.Generator(device=device).manual_seed(config.seed)
    choose = lambda logits: next_tokens(logits[:, :vocab_size], config.sampling, generator)  # noqa: E731
    completions = []
    given = [*config.prompts, *config.prompt_ids]
    for begin in range(0, len(prompts), config.batch_size):
        ids, mask = _right_pad(prompts[begin:begin + config.batch_size], pad_id)
        out = sample_t5(model, ids.to(device), config.max_new_tokens, start_id, eos_id, pad_id, choose, mask.to(device))
        for row, prompt in enumerate(given[begin:begin + config.batch_size]):
            generated = out[row, 1:].tolist()
            if eos_id in generated:
                generated = generated[:generated.index(eos_id) + 1]
            text = None
            if tokenizer is not None:
                text = tokenizer.decode(generated[:-1] if generated and generated[-1] == eos_id else generated)
            completions.append(Completion(prompt=prompt, text=text, ids=generated))
    return completions
