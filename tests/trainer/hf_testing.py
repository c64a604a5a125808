"""Shared pieces of the HF interop and generation tests: tiny random GPT-2s made locally with
transformers (never downloaded), and the jobs the multi-process tests run (`process_testing.run_jobs`).

Fixture weights never come from transformers' initialiser (which changes between its releases): the
models are built by transformers for their structure, then every parameter is drawn by `seed_weights`
from our own seeded generator."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

from trainer.data.batches import IGNORE_INDEX, Vocabulary, step_iterator
from trainer.models.gpt.data import build_datasets, collate

# The brief's tiny model: 2 layers, hidden 64, 4 heads.
TINY = {"n_layer": 2, "n_embd": 64, "n_head": 4, "n_positions": 128}
# Standard deviation of the tiny GPT-2's matrices: large, so logits are far apart (no argmax ties).
TINY_STD = 0.5
# Norm weights are drawn as 1 + NORM_NOISE * N(0, 1) and biases as NORM_NOISE * N(0, 1): not the
# identity, so a mix-up of norm or bias tensors shows in the logits.
NORM_NOISE = 0.1
TINY_VOCAB = 300
EOS = TINY_VOCAB - 1
LOGIT_TOLERANCE = 1e-5
DATA_TEST = Path(__file__).resolve().parents[2] / "data_test"


@torch.no_grad()
def seed_weights(model: torch.nn.Module, seed: int, std: float) -> torch.nn.Module:
    """Overwrite every parameter of ``model`` from a generator seeded with ``seed``, in name order.

    Matrices and embeddings get N(0, std^2); one-dimensional ``weight``s (norms) 1 + N(0, NORM_NOISE^2),
    other vectors (biases) N(0, NORM_NOISE^2). Tied parameters are one parameter and are drawn once.
    """
    generator = torch.Generator().manual_seed(seed)
    for name, param in sorted(model.named_parameters()):
        noise = torch.randn(param.shape, generator=generator, dtype=torch.float32)
        if param.dim() > 1:
            value = noise * std
        elif name.endswith("weight"):
            value = 1.0 + NORM_NOISE * noise
        else:
            value = NORM_NOISE * noise
        param.copy_(value)
    return model


def make_tiny_hf(directory: Path, vocab_size: int = TINY_VOCAB, seed: int = 0,
                 with_gpt2_tokenizer: bool = False) -> Path:
    """A random GPT2LMHeadModel saved with save_pretrained (optionally with GPT-2's vocab.json/merges.txt)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    eos = 50256 if with_gpt2_tokenizer else vocab_size - 1
    config = GPT2Config(vocab_size=vocab_size, bos_token_id=eos, eos_token_id=eos, **TINY)
    seed_weights(GPT2LMHeadModel(config), seed, TINY_STD).save_pretrained(directory)
    if with_gpt2_tokenizer:
        shutil.copyfile(DATA_TEST / "gpt2" / "gpt2-vocab.json", directory / "vocab.json")
        shutil.copyfile(DATA_TEST / "gpt2" / "gpt2-merges.txt", directory / "merges.txt")
    return directory


def hf_model(directory: Path):
    from transformers import GPT2LMHeadModel

    return GPT2LMHeadModel.from_pretrained(directory).eval()


def prompt_batch(lengths: tuple[int, ...] = (3, 9, 1, 14), vocab_size: int = TINY_VOCAB,
                 seed: int = 1) -> list[list[int]]:
    """Random prompts (ids below the EOS id) of the given lengths."""
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab_size - 1, (n,), generator=generator).tolist() for n in lengths]


def hf_greedy(model, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """transformers' greedy continuation of each prompt on its own (no padding involved)."""
    out = []
    with torch.no_grad():
        for ids in prompts:
            sequence = model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=max_new_tokens,
                                      pad_token_id=model.config.eos_token_id)
            out.append(sequence[0, len(ids):].tolist())
    return out


# -- multi-process jobs ----------------------------------------------------------------------------------

def job_generate(tp: int, pp: int, load: str, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    from trainer.generation.generate import GenerateConfig
    from trainer.models.dispatch import generate
    from trainer.generation.sampling import SamplingConfig

    config = GenerateConfig(load=load, prompt_ids=prompts, max_new_tokens=max_new_tokens,
                            sampling=SamplingConfig(greedy=True), tensor_model_parallel_size=tp,
                            pipeline_model_parallel_size=pp, batch_size=len(prompts))
    return [c.ids for c in generate(config)]


def job_train(tp: int, pp: int, source: str, save: str, steps: int) -> None:
    """Start from ``source`` (a checkpoint, or a HF directory through load_hf_weights), train ``steps`` AdamW
    steps on random tokens in a tp x pp layout with the trainer's ParallelModel, save the model (DCP)."""
    from trainer.checkpoint.load import load_checkpoint
    from trainer.checkpoint.save import save_checkpoint
    from trainer.config import OptimizerConfig, ParallelismConfig
    from trainer.models.gpt.data import GPTMicroBatch
    from trainer.checkpoint.store import MODEL_PREFIX
    from trainer.models.gpt.convert import checkpoint_model, load_hf_weights
    from trainer.checkpoint.hf_files import is_hf_directory, read_hf_config
    from trainer.models.gpt.hf import shape_from_hf_config
    from trainer.optim.optimizer import build_optimizer
    from trainer.parallel.dims import ParallelDims, pad_vocab_size
    from trainer.models.gpt.spec import PLAN
    from trainer.parallel.runner import ParallelModel

    if is_hf_directory(source):
        config = read_hf_config(source)
        shape, vocab = shape_from_hf_config(config, pad_vocab_size(config["vocab_size"], 64, tp)), config["vocab_size"]
    else:
        root, iteration, model_info = checkpoint_model(source)
        shape, vocab = model_info.shape, model_info.vocab_size
    shape = dataclasses.replace(shape, hidden_dropout=0.0, attention_dropout=0.0)
    dims = ParallelDims(pp=pp, dp=dist.get_world_size() // (tp * pp), tp=tp, micro_batch_size=2, num_microbatches=2)
    model = ParallelModel(PLAN, shape, dims, dims.build_mesh("cpu"),
                          ParallelismConfig(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp),
                          torch.device("cpu"), seed=0, checkpoint_activations=False, autocast_dtype=None)
    if is_hf_directory(source):
        load_hf_weights(model.named_parameters(), source, shape)
    else:
        load_checkpoint(root, iteration, {MODEL_PREFIX + n: p.detach() for n, p in model.named_parameters()})
    optimizer = build_optimizer(model.named_parameters(), OptimizerConfig(lr=1e-2), foreach=False)
    model.set_train(True)
    for step in range(steps):
        generator = torch.Generator().manual_seed(step)
        batches = []
        for _ in range(dims.num_microbatches):
            tokens = torch.randint(0, vocab, (2, 17), generator=generator)
            positions = torch.arange(16).expand(2, 16)
            batches.append(GPTMicroBatch(tokens=tokens[:, :-1], position_ids=positions, targets=tokens[:, 1:]))
        optimizer.zero_grad(set_to_none=True)
        model.run(batches, train=True)
        optimizer.step()
    save_checkpoint(save, steps, {MODEL_PREFIX + n: p.detach() for n, p in model.named_parameters()})


@torch.no_grad()
def hf_loglikelihood(model, context: list[int], continuation: list[int]) -> tuple[float, bool]:
    """A Hugging Face causal LM's log-likelihood of ``continuation`` after ``context`` (token ids), summed in
    float64, and whether greedy decoding would produce it."""
    ids = torch.tensor([context + continuation])
    logits = model(ids[:, :-1]).logits[0, -len(continuation):].float()
    target = torch.tensor(continuation)
    log_prob = torch.log_softmax(logits, -1).gather(-1, target[:, None]).double().sum()
    return float(log_prob), bool((logits.argmax(-1) == target).all())


def hf_first_step_loss(config, model, padded_vocab_size: int, train_samples: int) -> float:
    """transformers' ``model``'s mean micro-batch loss on the run's first global batch (one data-parallel rank;
    the train split sized for ``train_samples``).

    The trainer's padded vocabulary rows start at zero, so their logits are 0 and take part in the
    softmax (as in Megatron): transformers' logits get the same zero columns.
    """
    vocabulary = Vocabulary(size=config.model.vocab_size, eod_id=None, pad_id=None)
    global_batch, micro = config.training.global_batch_size, config.training.micro_batch_size
    train_ds, _, _ = build_datasets(config.data, config.model.seq_length, vocabulary, (train_samples, 0, 0))
    microbatches = next(step_iterator(train_ds, 0, micro, global_batch // micro, 0, 1, vocabulary.size, collate))
    losses = []
    with torch.no_grad():
        for mb in microbatches:
            logits = model(input_ids=mb.tokens, position_ids=mb.position_ids).logits
            logits = F.pad(logits, (0, padded_vocab_size - logits.shape[-1]))
            losses.append(F.cross_entropy(logits.flatten(0, 1), mb.targets.flatten(), ignore_index=IGNORE_INDEX))
    return float(torch.stack(losses).mean())
