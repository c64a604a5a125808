"""SQuAD fine-tuning step: our BERT with the span head (through `trainer.parallel.runner.ParallelModel`, BERT's plan
with the span loss, the trainer's AdamW groups) versus transformers' BertForQuestionAnswering, same weights,
same batch, same AdamW settings, in the same process. Steps alternate between the two (both see the same
load); a round's figure is its median step time, the reported one the median of rounds.

    python -m benchmarks.bert_qa                           # bert-base shape, batch 8 x 384 (use a GPU)
    python -m benchmarks.bert_qa --layers 2 --hidden 128 --seq 128 --batch 8 --device cpu --threads 1

Prints features/s of both and the ratio ours / transformers (target >= 0.95).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import transformers

from trainer.config import OptimizerConfig, ParallelismConfig
from trainer.models.bert.data import BertMicroBatch
from trainer.models.bert.hf import hf_bert_names
from trainer.models.bert.model import SPAN_HEAD, BertShape
from trainer.models.bert.spec import SPAN_PLAN
from trainer.optim.optimizer import build_optimizer
from trainer.parallel.dims import ParallelDims
from trainer.parallel.runner import ParallelModel

VOCAB = 30522
LR = 3e-5


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def build(args: argparse.Namespace, device: torch.device):
    """Our model and transformers' with the same weights; a batch of random features."""
    config = transformers.BertConfig(vocab_size=VOCAB, hidden_size=args.hidden, num_hidden_layers=args.layers,
                                     num_attention_heads=args.hidden // 64 or 1, intermediate_size=4 * args.hidden,
                                     max_position_embeddings=max(512, args.seq), hidden_dropout_prob=0.0,
                                     attention_probs_dropout_prob=0.0)
    theirs = transformers.BertForQuestionAnswering(config).to(device)
    shape = BertShape(num_layers=args.layers, hidden_size=args.hidden, num_attention_heads=config.num_attention_heads,
                      ffn_hidden_size=4 * args.hidden, max_position_embeddings=config.max_position_embeddings,
                      padded_vocab_size=VOCAB, binary_head=False, head=SPAN_HEAD)
    dims = ParallelDims(pp=1, dp=1, tp=1, micro_batch_size=args.batch, num_microbatches=1)
    ours = ParallelModel(SPAN_PLAN, shape, dims, None, ParallelismConfig(), device, 0, False, None)
    hf_state = theirs.state_dict()
    with torch.no_grad():
        for name, param in ours.named_parameters():
            param.copy_(hf_state[hf_bert_names(shape)[name]])
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, VOCAB, (args.batch, args.seq), generator=generator)
    types = (torch.arange(args.seq) >= args.seq // 4).long().expand(args.batch, -1).contiguous()
    mask = torch.ones(args.batch, args.seq, dtype=torch.long)
    targets = torch.randint(0, args.seq, (args.batch, 2), generator=generator)
    batch = BertMicroBatch(tokens, types, mask, targets).to(device)
    return ours, theirs, batch


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--seq", type=int, default=384)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--threads", type=int, help="torch CPU threads")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    ours, theirs, batch = build(args, device)
    our_optimizer = build_optimizer(ours.named_parameters(), OptimizerConfig(lr=LR, weight_decay=0.01))
    their_optimizer = torch.optim.AdamW(theirs.parameters(), lr=LR, weight_decay=0.01)
    ours.set_train(True)
    theirs.train()

    def our_step() -> None:
        our_optimizer.zero_grad(set_to_none=True)
        ours.run([batch], train=True)
        our_optimizer.step()

    def their_step() -> None:
        their_optimizer.zero_grad(set_to_none=True)
        out = theirs(input_ids=batch.tokens, token_type_ids=batch.token_types, attention_mask=batch.padding_mask,
                     start_positions=batch.targets[:, 0], end_positions=batch.targets[:, 1])
        out.loss.backward()
        their_optimizer.step()

    rounds = {"ours": [], "transformers": []}
    for step in (our_step, their_step):
        step()  # warm-up
    for _ in range(args.rounds):
        times = {"ours": [], "transformers": []}
        for _ in range(args.steps):
            for name, step in (("ours", our_step), ("transformers", their_step)):
                _sync(device)
                start = time.perf_counter()
                step()
                _sync(device)
                times[name].append(time.perf_counter() - start)
        for name in rounds:
            rounds[name].append(statistics.median(times[name]))
    rate = {name: args.batch / statistics.median(values) for name, values in rounds.items()}
    print(f"device {device}, {args.layers} layers x {args.hidden}, batch {args.batch} x {args.seq}")
    print(f"ours          {rate['ours']:.1f} features/s")
    print(f"transformers  {rate['transformers']:.1f} features/s")
    print(f"ratio         {rate['ours'] / rate['transformers']:.3f}")


if __name__ == "__main__":
    main()
