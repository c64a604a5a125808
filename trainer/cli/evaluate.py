"""``evaluate``: LAMBADA cloze accuracy or perplexity of a GPT checkpoint or a local HF GPT-2 directory.

    evaluate --task lambada --data lambada_test.jsonl --load gpt2/ --strict-lambada
    evaluate --task perplexity --data wiki.test.tokens --load checkpoints/run1 --overlapping-eval 32
    evaluate --task perplexity --data out/corpus_text_document --load-hf gpt2/ --json
    # 4 CPU processes: tp 2 x dp 2 (the data split over the dp replicas, the results reduced)
    evaluate --task lambada --data lambada_test.jsonl --load gpt2/ --nproc-per-node 4 --device cpu \\
             --tensor-model-parallel-size 2

Shows a progress bar (stderr) and the results, then ends with one JSON line; ``--json`` prints only that
line. Without tokenizer flags the tokenizer files stored with the model are used.
"""

from __future__ import annotations

import argparse
import json

from indexed_dataset.cli_parser import CommandParser
from preprocess.tokenizers.flags import add_tokenizer_arguments, tokenizer_config_from_args
from trainer.cli.collective import (
    EXIT_USAGE,
    CollectiveCommand,
    add_layout_arguments,
    check_tokenizer_flags,
    launch_config_from_args,
    run_collective,
)
from trainer.config import LaunchConfig
from trainer.evaluation.detokenize import AUTO, DETOKENIZERS
from trainer.evaluation.evaluate import TASKS, EvaluateConfig, check_evaluation, evaluate
from trainer.evaluation.scoring import EvalModelConfig
from trainer.checkpoint.hf_files import is_hf_directory
from trainer.models.dispatch import resolve_scoring_source

PROG = "evaluate"


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser(prog=PROG, description="LAMBADA cloze accuracy or perplexity of a GPT checkpoint or "
                                                  "a HF GPT-2 directory, in any tensor/pipeline/data-parallel layout.")
    parser.add_argument("--task", required=True, choices=TASKS, help="what to measure")
    parser.add_argument("--data", required=True,
                        help='lambada: JSON lines {"text": ...}; perplexity: a text file or a .bin/.idx token file')
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--load", help="checkpoint root, iter_XXXXXXX directory, or HF GPT-2 directory")
    source.add_argument("--load-hf", help="a HF GPT-2 directory (config.json + weights)")
    parser.add_argument("--no-verify", action="store_true",
                        help="load without checking the checkpoint's files against the checksums of its manifest")
    lambada = parser.add_argument_group("lambada")
    lambada.add_argument("--strict-lambada", action="store_true",
                         help="the target is the last whitespace-separated word (Megatron's); else the last token")
    perplexity = parser.add_argument_group("perplexity")
    perplexity.add_argument("--seq-length", type=int, help="inputs per window (default: the model's positions)")
    perplexity.add_argument("--overlapping-eval", type=int,
                            help="targets scored per window after the first; the rest is context "
                                 "(default: --seq-length, disjoint windows)")
    perplexity.add_argument("--detokenizer", choices=(AUTO, *DETOKENIZERS), default=AUTO,
                            help="undo a data set's tokenisation before tokenizing (auto: by file name, as "
                                 "Megatron: 'wiki' -> wikitext, 'ptb' -> ptb)")
    parser.add_argument("--batch-size", type=int, default=8, help="rows per forward pass on one data-parallel replica")
    parser.add_argument("--json", action="store_true", help="print only the final JSON line (no progress bar)")
    add_tokenizer_arguments(parser, required=False, preprocessing=False)
    add_layout_arguments(parser)
    return parser


def config_from_args(args: argparse.Namespace) -> tuple[EvaluateConfig, LaunchConfig]:
    """The run's config and launch settings.

    Raises:
        ValueError: a flag value is invalid (TrainConfigError included).
    """
    check_tokenizer_flags(args)
    if args.load_hf is not None and not is_hf_directory(args.load_hf):
        raise ValueError(f"--load-hf {args.load_hf}: not a HF model directory (no config.json)")
    model = EvalModelConfig(load=args.load or args.load_hf, no_verify=args.no_verify,
                            tokenizer=tokenizer_config_from_args(args), batch_size=args.batch_size,
                            tensor_model_parallel_size=args.tensor_model_parallel_size,
                            pipeline_model_parallel_size=args.pipeline_model_parallel_size, device=args.device,
                            progress=not args.json)
    config = EvaluateConfig(model=model, task=args.task, data=args.data, strict_lambada=args.strict_lambada,
                            seq_length=args.seq_length, overlapping_eval=args.overlapping_eval,
                            detokenizer=args.detokenizer)
    return config, launch_config_from_args(args)


def _run(config: EvaluateConfig) -> dict:
    """`evaluate` on the model as its family scores it (the registry finds the family)."""
    return evaluate(config, resolve_scoring_source(config.model.load, config.model.tensor_model_parallel_size))


def _check(config: EvaluateConfig, world_size: int) -> None:
    """`check_evaluation` after the registry's own checks of the family and source."""
    source = resolve_scoring_source(config.model.load, config.model.tensor_model_parallel_size)
    check_evaluation(config, world_size, source)


COMMAND = CollectiveCommand(prog=PROG, build_parser=build_parser, run=_run, check=_check)


def format_record(record: dict) -> list[str]:
    """The human-readable lines of a result record (Megatron's names)."""
    if record["task"] == "lambada":
        return [f"lambada {record['data']}: accuracy {record['accuracy']:.4f} "
                f"({record['correct']} of {record['count']} passages, strict {record['strict_lambada']})"]
    lines = [f"perplexity {record['data']}: avg loss {record['avg_loss']:.4E} | ppl {record['ppl']:.4E} | "
             f"{record['num_tokens']} tokens, seq_length {record['seq_length']}, "
             f"overlapping_eval {record['overlapping_eval']}"]
    if record["adjusted_ppl"] is not None:
        lines.append(f"adjusted ppl {record['adjusted_ppl']:.4E} | token ratio {record['token_ratio']:.4f} "
                     f"({record['num_original_tokens']} words)")
    return lines


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` (default: the command line), evaluate (or launch the processes that do), print."""
    args = build_parser().parse_args(argv)
    try:
        config, launch_config = config_from_args(args)
    except ValueError as error:
        COMMAND.fail(str(error))
        return EXIT_USAGE
    status, record = run_collective(COMMAND, config, launch_config, config.model.device,
                                    verbose=config.model.progress)
    if record is not None:
        if not args.json:
            for line in format_record(record):
                print(line)
        print(json.dumps(record))
    return status
