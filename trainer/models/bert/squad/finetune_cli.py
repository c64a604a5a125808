"""``finetune --task squad``: fine-tune and evaluate BERT for extractive question answering.

    finetune --task squad --train-file train-v1.1.json --valid-file dev-v1.1.json --load-hf bert-base-uncased/ \\
             --save ckpt/squad --max-seq-length 384 --doc-stride 128 --epochs 2 --lr 3e-5 --micro-batch-size 12
    finetune --task squad --valid-file dev-v1.1.json --load ckpt/squad --n-best-size 20 --max-answer-length 30

Evaluation prints ``{'exact_match': ..., 'f1': ...}`` and writes predictions.json (the official format),
nbest_predictions.json and eval_results.json into ``--output-dir`` (default ``--save``). Under a launcher's
process group fine-tuning runs data- and tensor-parallel (``--tensor-model-parallel-size``).
"""

from __future__ import annotations

import argparse
import logging

from indexed_dataset.cli_parser import CommandParser, finite_float, seed_value
from indexed_dataset.cli_support import run_command
from trainer.cli.flags import flags_in_message
from trainer.config import LR_DECAY_STYLES, OptimizerConfig
from trainer.errors import CheckpointError
from trainer.models.bert.squad.cli import add_feature_arguments, feature_options, model_positions
from trainer.models.bert.squad.finetune import ScratchShape, SquadConfig, finetune

TASKS = ("squad",)


def build_parser() -> CommandParser:
    parser = CommandParser(prog="finetune", description="Fine-tune and evaluate BERT for extractive QA.")
    parser.add_argument("--task", choices=TASKS, required=True)
    parser.add_argument("--train-file", help="SQuAD-format training file (absent: evaluate only)")
    parser.add_argument("--valid-file", help="SQuAD-format evaluation file")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--load-hf", help="Hugging Face BERT directory to start from")
    source.add_argument("--load", help="tokenmill BERT checkpoint to start from")
    parser.add_argument("--save", help="checkpoint directory for the fine-tuned model")
    parser.add_argument("--overwrite-save", action="store_true",
                        help="start over in a --save that holds another run (not continued with --load): its "
                             "checkpoints and files are deleted first; without it such a --save is refused")
    parser.add_argument("--output-dir", help="predictions and eval_results.json (default: --save)")
    parser.add_argument("--epochs", type=finite_float, default=2.0, help="passes over the training file (default %(default)s)")
    parser.add_argument("--micro-batch-size", type=int, default=12, help="features per step and replica (default %(default)s)")
    parser.add_argument("--num-microbatches", type=int, default=1, help="gradient accumulation steps")
    parser.add_argument("--lr", type=finite_float, default=3e-5, help="peak learning rate (default %(default)s)")
    parser.add_argument("--min-lr", type=finite_float, default=0.0, help="learning rate at the end (default %(default)s)")
    parser.add_argument("--lr-warmup-fraction", type=finite_float, default=0.1,
                        help="share of the steps that warm the learning rate up (default %(default)s)")
    # WSD needs its annealing length, a flag of `train` only.
    parser.add_argument("--lr-decay-style", choices=[s for s in LR_DECAY_STYLES if s != "WSD"], default="linear",
                        help="(default %(default)s)")
    parser.add_argument("--weight-decay", type=finite_float, default=0.01, help="(default %(default)s)")
    parser.add_argument("--hidden-dropout", type=finite_float, help="default: the loaded model's")
    parser.add_argument("--tensor-model-parallel-size", type=int, default=1)
    parser.add_argument("--seed", type=seed_value, default=42, help="(default %(default)s)")
    scratch = ScratchShape()
    group = parser.add_argument_group("a fresh encoder (without --load/--load-hf)")
    for name in ("num_layers", "hidden_size", "num_attention_heads", "ffn_hidden_size"):
        group.add_argument("--" + name.replace("_", "-"), type=int, default=getattr(scratch, name))
    add_feature_arguments(parser)
    return parser


def finetune_config(args: argparse.Namespace) -> SquadConfig:
    optimizer = OptimizerConfig(lr=args.lr, min_lr=args.min_lr, weight_decay=args.weight_decay,
                                lr_warmup_fraction=args.lr_warmup_fraction, lr_decay_style=args.lr_decay_style)
    return SquadConfig(train_file=args.train_file, valid_file=args.valid_file, load_hf=args.load_hf, load=args.load,
                       save=args.save, overwrite_save=args.overwrite_save, output_dir=args.output_dir,
                       vocab_file=args.vocab_file,
                       lower_case=args.lower_case,
                       features=feature_options(args, model_positions(args.load, args.load_hf)),
                       scratch=ScratchShape(num_layers=args.num_layers, hidden_size=args.hidden_size,
                                            num_attention_heads=args.num_attention_heads,
                                            ffn_hidden_size=args.ffn_hidden_size),
                       optimizer=optimizer, epochs=args.epochs, micro_batch_size=args.micro_batch_size,
                       num_microbatches=args.num_microbatches,
                       tensor_model_parallel_size=args.tensor_model_parallel_size, hidden_dropout=args.hidden_dropout,
                       n_best_size=args.n_best_size, max_answer_length=args.max_answer_length, seed=args.seed,
                       device=args.device)


def main(argv: list[str] | None = None) -> int:
    """``finetune``; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    def command() -> int:
        try:
            result = finetune(finetune_config(args))
        except CheckpointError as error:  # its message names config fields: show them as this command's flags
            raise CheckpointError(flags_in_message(str(error), parser)) from None
        if result.metrics is not None:
            print(result.metrics)
        return 0

    return run_command("finetune", command)


if __name__ == "__main__":
    raise SystemExit(main())
