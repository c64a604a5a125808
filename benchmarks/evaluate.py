"""Perplexity speed: our ``evaluate --task perplexity`` against transformers scoring the same text, on CPU.

    python -m benchmarks.evaluate                          # GPT-2-shaped, 4 layers x 256, seq 512, batch 4
    python -m benchmarks.evaluate --layers 12 --hidden 768 --heads 12 --seq-length 1024 --repeats 3

A GPT2LMHeadModel of the given shape (GPT-2's vocabulary and tokenizer files from ``data_test/gpt2``,
weights from a seeded generator) is saved with save_pretrained; the text is ``data_test/evaluate``'s
WikiText-like sample repeated to ``--tokens`` tokens. Both sides score the same windows (Megatron's:
``--seq-length`` inputs, ``--overlapping-eval`` targets per window after the first) in batches of
``--batch-size`` on the same weights with the same torch thread count, each side computing only what it
reads:

- ours: `trainer.evaluation.perplexity.evaluate_perplexity` (tokenising, windows, scoring): the blocks over
  every position, the final norm, head and log-softmax over the scored positions only (the first window's
  all, a later window's last ``--overlapping-eval``), in chunks of about 16 MiB of logits;
- transformers: tokenising with its GPT2TokenizerFast, then ``GPT2LMHeadModel(inputs, logits_to_keep=K)``
  on the same windows, its own way to skip the head where nothing is read (K: the batch's scored positions
  counted from the end; all of them in a batch holding the first window), and one fused
  ``F.cross_entropy`` over those logits, summed over the scored targets.

Runs alternate ours/theirs after one warm-up each; figures are medians of ``--repeats``; model loading is not
timed. The two perplexities are checked equal (relative 1e-5) before anything is reported. Prints one JSON
line. Needs transformers >= 4.50 (``logits_to_keep``).
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from trainer.evaluation.detokenize import detokenize_wikitext
from trainer.evaluation.perplexity import evaluate_perplexity, lm_windows
from trainer.evaluation.scoring import EvalModelConfig, open_eval_model
from trainer.models.dispatch import resolve_scoring_source

DATA_TEST = Path(__file__).resolve().parents[1] / "data_test"
SAMPLE = DATA_TEST / "evaluate" / "wiki_sample.test.tokens"
EOT = 50256
# Matrices' standard deviation (GPT-2's initialiser range).
WEIGHT_STD = 0.02
PPL_RTOL = 1e-5


def make_model(directory: Path, layers: int, hidden: int, heads: int, positions: int) -> Path:
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_layer=layers, n_embd=hidden, n_head=heads, n_positions=positions, vocab_size=50257)
    model = GPT2LMHeadModel(config)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for _, param in sorted(model.named_parameters()):
            param.copy_(torch.randn(param.shape, generator=generator) * WEIGHT_STD + (param.dim() == 1) * 1.0)
    model.save_pretrained(directory)
    shutil.copyfile(DATA_TEST / "gpt2" / "gpt2-vocab.json", directory / "vocab.json")
    shutil.copyfile(DATA_TEST / "gpt2" / "gpt2-merges.txt", directory / "merges.txt")
    return directory


def write_text(path: Path, num_tokens: int) -> Path:
    """The WikiText-like sample repeated until it holds about ``num_tokens`` GPT-2 tokens (path names 'wiki',
    so both sides detokenise it)."""
    sample = SAMPLE.read_text(encoding="utf-8")
    repeats = max(1, math.ceil(num_tokens / 400))  # the sample is ~400 tokens
    path.write_text(sample * repeats, encoding="utf-8")
    return path


@torch.no_grad()
def transformers_ppl(model, tokenizer, path: Path, seq_length: int, overlap: int, batch_size: int) -> float:
    tokens = np.array(tokenizer(detokenize_wikitext(path.read_text(encoding="utf-8"))).input_ids, dtype=np.int64)
    rows = lm_windows(tokens, seq_length, overlap, EOT)
    total_nll = 0.0
    for start in range(0, len(rows), batch_size):
        batch = rows[start:start + batch_size]
        ids = torch.from_numpy(np.stack([row.ids for row in batch]))
        # Logits of the last `keep` positions only: every scored target of the batch lies among them.
        keep = seq_length - min(row.first for row in batch)
        logits = model(ids[:, :-1], logits_to_keep=keep).logits.float()
        nll = F.cross_entropy(logits.flatten(0, 1), ids[:, -keep:].flatten(), reduction="none").view(len(batch), keep)
        offset = seq_length - keep
        for slot, row in enumerate(batch):
            total_nll += float(nll[slot, row.first - offset:row.last - offset].double().sum())
    return math.exp(total_nll / (len(tokens) - 1))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--seq-length", type=int, default=512)
    parser.add_argument("--overlapping-eval", type=int, default=None, help="default: --seq-length (disjoint)")
    parser.add_argument("--tokens", type=int, default=8192, help="about this many tokens of text")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    overlap = args.overlapping_eval or args.seq_length
    from transformers import GPT2LMHeadModel, GPT2TokenizerFast

    with tempfile.TemporaryDirectory() as scratch:
        directory = make_model(Path(scratch) / "model", args.layers, args.hidden, args.heads, args.seq_length)
        text = write_text(Path(scratch) / "wiki.test.tokens", args.tokens)
        theirs_model = GPT2LMHeadModel.from_pretrained(directory).eval()
        tokenizer = GPT2TokenizerFast(vocab=str(directory / "vocab.json"), merges=str(directory / "merges.txt"))
        config = EvalModelConfig(load=str(directory), batch_size=args.batch_size, device="cpu", progress=False)
        with open_eval_model(config, resolve_scoring_source(config.load, 1)) as ours_model:
            run_ours = lambda: evaluate_perplexity(ours_model, text, args.seq_length, overlap)  # noqa: E731
            run_theirs = lambda: transformers_ppl(theirs_model, tokenizer, text, args.seq_length,  # noqa: E731
                                                  overlap, args.batch_size)
            ours_result, theirs_ppl = run_ours(), run_theirs()  # warm-up, and the check
            if not math.isclose(ours_result.ppl, theirs_ppl, rel_tol=PPL_RTOL):
                raise SystemExit(f"perplexities differ: ours {ours_result.ppl}, transformers {theirs_ppl}")
            ours_s, theirs_s = [], []
            for _ in range(args.repeats):
                for run, times in ((run_ours, ours_s), (run_theirs, theirs_s)):
                    start = time.perf_counter()
                    run()
                    times.append(time.perf_counter() - start)
    num_tokens = ours_result.num_tokens
    ours_tps, theirs_tps = num_tokens / statistics.median(ours_s), num_tokens / statistics.median(theirs_s)
    print(json.dumps({"shape": f"{args.layers}x{args.hidden}", "seq_length": args.seq_length,
                      "overlapping_eval": overlap, "batch_size": args.batch_size, "threads": args.threads,
                      "num_tokens": num_tokens, "ppl": ours_result.ppl, "ours_tokens_per_s": round(ours_tps, 1),
                      "transformers_tokens_per_s": round(theirs_tps, 1), "ratio": round(ours_tps / theirs_tps, 3)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
