"""Generation speed: our `generate` (KV cache, left-padded batches) vs transformers' `generate`, on CPU.

    python -m benchmarks.generate                     # tiny and GPT-2-small-shaped models, batch 1 and 4
    python -m benchmarks.generate --models small --new-tokens 128 --repeats 5

Both run greedy decoding in this process on the same random weights (a GPT2LMHeadModel made locally
and saved with save_pretrained; ours loads that directory), the same prompts (batch 4: lengths 32,
24, 16 and 8, left-padded, with an attention mask for transformers) and the same number of new tokens
(EOS stopping off on both sides), with the same torch thread count (``--threads``, default 1: one
intra-op thread, as torchrun gives each process; on a shared machine busy OpenMP threads make
multi-threaded timings vary several-fold). The runs alternate ours/theirs; figures are medians of
``--repeats`` timed runs after one warm-up. Model loading is not timed. The two outputs are checked
to be the same tokens before anything is reported.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from trainer.generate import generate_ids
from trainer.generation.parallel import GenerationLayout, ShardedGPT
from trainer.generation.sampling import SamplingConfig
from trainer.hf_convert import load_hf_weights
from trainer.hf_files import read_hf_config
from trainer.models.gpt.hf import shape_from_hf_config

MODELS = {
    "tiny": {"n_layer": 2, "n_embd": 64, "n_head": 4, "n_positions": 1024, "vocab_size": 50257},
    "small": {"n_layer": 12, "n_embd": 768, "n_head": 12, "n_positions": 1024, "vocab_size": 50257},
}
PROMPT_LENGTHS = {1: (32,), 4: (32, 24, 16, 8)}
SEED = 1234
GREEDY = SamplingConfig(greedy=True)


def save_random_gpt2(directory: Path, dims: dict) -> None:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(SEED)
    GPT2LMHeadModel(GPT2Config(**dims)).save_pretrained(directory)


def prompts_of(batch: int, vocab: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(SEED)
    return [torch.randint(0, vocab, (n,), generator=generator).tolist() for n in PROMPT_LENGTHS[batch]]


def ours_runner(directory: Path):
    config = read_hf_config(directory)
    shape = shape_from_hf_config(config)
    model = ShardedGPT(shape, config["vocab_size"], GenerationLayout(tp=1, pp=1, dp=1), None, torch.device("cpu"))
    load_hf_weights(model.named_parameters(), directory, shape)
    model.finish_loading()
    return lambda prompts, new: generate_ids(model, prompts, new, GREEDY, eod_id=None, generator=None)


def theirs_runner(directory: Path):
    from transformers import GPT2LMHeadModel

    model = GPT2LMHeadModel.from_pretrained(directory).eval()
    pad = 0

    def run(prompts: list[list[int]], new: int) -> list[list[int]]:
        longest = max(map(len, prompts))
        ids = torch.tensor([[pad] * (longest - len(p)) + p for p in prompts])
        mask = torch.tensor([[0] * (longest - len(p)) + [1] * len(p) for p in prompts])
        with torch.no_grad():
            out = model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=new, min_new_tokens=new,
                                 eos_token_id=None, pad_token_id=pad)
        return out[:, longest:].tolist()

    return run


def timed(run, prompts, new) -> tuple[float, list[list[int]]]:
    start = time.perf_counter()
    out = run(prompts, new)
    return time.perf_counter() - start, out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    parser.add_argument("--batches", nargs="+", type=int, choices=list(PROMPT_LENGTHS), default=list(PROMPT_LENGTHS))
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (both sides)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, greedy, {args.new_tokens} new tokens, "
          f"medians of {args.repeats}")
    print(f"{'model':<6} {'batch':>5} {'ours tok/s':>11} {'HF tok/s':>10} {'ratio':>6}")
    worst = float("inf")
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            directory = Path(tmp) / name
            save_random_gpt2(directory, MODELS[name])
            ours, theirs = ours_runner(directory), theirs_runner(directory)
            for batch in args.batches:
                prompts = prompts_of(batch, MODELS[name]["vocab_size"])
                _, ours_out = timed(ours, prompts, args.new_tokens)
                _, theirs_out = timed(theirs, prompts, args.new_tokens)
                if ours_out != theirs_out:
                    print(f"{name} batch {batch}: outputs differ", file=sys.stderr)
                    return 1
                ours_s, theirs_s = [], []
                for _ in range(args.repeats):
                    ours_s.append(timed(ours, prompts, args.new_tokens)[0])
                    theirs_s.append(timed(theirs, prompts, args.new_tokens)[0])
                tokens = batch * args.new_tokens
                ours_rate, theirs_rate = tokens / statistics.median(ours_s), tokens / statistics.median(theirs_s)
                worst = min(worst, ours_rate / theirs_rate)
                print(f"{name:<6} {batch:>5} {ours_rate:>11.1f} {theirs_rate:>10.1f} {ours_rate / theirs_rate:>6.2f}")
    print(f"lowest ratio (ours / transformers): {worst:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
