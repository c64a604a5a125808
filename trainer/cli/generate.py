"""``generate``: continue prompts with a tokenmill checkpoint or a local Hugging Face GPT-2 or T5/mT5 directory.

    generate --load gpt2/ --prompt "Hello, my name is" --max-new-tokens 20 --greedy
    generate --load checkpoints/run1 --prompt-file prompts.txt --top-p 0.9 --temperature 0.8 --json
    generate --load checkpoints/run1 --prompt-ids "464 2068 7586" --vocab-file gpt2-vocab.json \\
             --merge-file gpt2-merges.txt --tokenizer-type GPT2BPETokenizer
    # 2 CPU processes, tensor parallel (started through torch's elastic launcher, as train does)
    generate --load gpt2/ --prompt "Hello" --nproc-per-node 2 --device cpu --tensor-model-parallel-size 2
    # a T5/mT5 directory (config.json model_type t5/mt5) or a train --model t5 checkpoint: encoder
    # input -> decoder output; here split into two pipeline stages (encoder/decoder blocks), one process each
    generate --load t5-small/ --prompt "translate English to German: Hello" --greedy \\
             --nproc-per-node 2 --pipeline-model-parallel-size 2
    # a Switch Transformers directory (or a MoE checkpoint): each MoE layer's experts split over 2
    # processes, each generating half of the prompts (DeepSpeed's spelling: --moe_ep_size 2)
    generate --load switch-base-8/ --prompt-file prompts.txt --greedy --nproc-per-node 2 \\
             --expert-model-parallel-size 2

Without tokenizer flags the tokenizer files stored with the model are used. Prints each prompt and its
continuation under ``--- prompt N ---`` and ``--- continuation N ---`` lines (``--json``: one object per
prompt and line, with ``prompt``, ``text`` and the generated ``ids``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from dataclasses import asdict
from pathlib import Path

from indexed_dataset.cli_parser import CommandParser, finite_float, seed_value
from indexed_dataset.errors import REPORTED_ERRORS
from preprocess.tokenizers.flags import add_tokenizer_arguments, tokenizer_config_from_args
from trainer.cli.collective import (
    EXIT_ERROR,
    EXIT_USAGE,
    CollectiveCommand,
    add_layout_arguments,
    check_tokenizer_flags,
    launch_config_from_args,
    run_collective,
)
from trainer.cli.train_args import option_name
from trainer.config import LaunchConfig, MoEConfig
from trainer.generation.generate import GenerateConfig
from trainer.models.dispatch import check_generation
from trainer.generation.sampling import SamplingConfig
from trainer.models import spec_for_source

PROG = "generate"
# The train flag (and its DeepSpeed aliases) that ``generate`` takes as is.
EXPERT_PARALLEL_FIELD = "expert_model_parallel_size"


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser(prog=PROG, description="Continue prompts with a GPT or T5 checkpoint, or a HF GPT-2 / "
                                                  "T5 / mT5 directory.")
    parser.add_argument("--load", required=True,
                        help="checkpoint root, iter_XXXXXXX directory, or HF GPT-2 / T5 / mT5 directory")
    parser.add_argument("--no-verify", action="store_true",
                        help="load without checking the checkpoint's files against the checksums of its manifest")
    prompts = parser.add_argument_group("prompts (any mix; texts first, then id prompts)")
    prompts.add_argument("--prompt", action="append", default=[], help="a prompt text (repeatable)")
    prompts.add_argument("--prompt-file", help="a file with one prompt text per line (empty lines skipped)")
    prompts.add_argument("--prompt-ids", action="append", default=[], help='a prompt as token ids "ID ID ..." '
                                                                          "(repeatable)")
    sampling = parser.add_argument_group("sampling")
    sampling.add_argument("--greedy", action="store_true", help="always take the most likely token")
    sampling.add_argument("--temperature", type=finite_float, default=1.0, help="divide the logits by this (> 0)")
    sampling.add_argument("--top-k", type=int, default=0, help="sample among the k most likely tokens (0 = all)")
    sampling.add_argument("--top-p", type=finite_float, default=1.0, help="nucleus sampling mass, in (0, 1] (1 = all)")
    sampling.add_argument("--max-new-tokens", type=int, default=32, help="tokens generated per prompt at most")
    sampling.add_argument("--seed", type=seed_value, default=1234, help="seed of the sampling generator")
    parser.add_argument("--batch-size", type=int, default=16, help="prompts per forward pass")
    parser.add_argument("--json", action="store_true", help="one JSON object per prompt and line")
    add_tokenizer_arguments(parser, required=False, preprocessing=False)
    add_layout_arguments(parser)
    _add_expert_parallel_argument(parser)
    return parser


def _add_expert_parallel_argument(parser: argparse.ArgumentParser) -> None:
    """``--expert-model-parallel-size`` under train's spellings (`trainer.config.MoEConfig`'s field and aliases)."""
    field = next(f for f in dataclasses.fields(MoEConfig) if f.name == EXPERT_PARALLEL_FIELD)
    group = parser.add_argument_group("mixture of experts")
    group.add_argument(option_name(field.name), *field.metadata["aliases"], dest=field.name, type=int,
                       default=field.default, metavar="E",
                       help="shard each MoE layer's experts over E data-parallel processes, each generating its own "
                            "prompts (E divides the experts and the data-parallel size)")


def _read_prompt_file(path: str) -> list[str]:
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as error:
        raise ValueError(f"{path}: cannot read prompt file ({error})") from None
    return [line for line in lines if line.strip()]


def _parse_ids(text: str) -> list[int]:
    try:
        return [int(token) for token in text.replace(",", " ").split()]
    except ValueError:
        raise ValueError(f"--prompt-ids {text!r}: expected integers separated by spaces") from None


def config_from_args(args: argparse.Namespace) -> tuple[GenerateConfig, LaunchConfig]:
    """The run's config and launch settings.

    Raises:
        ValueError: a flag value is invalid (TrainConfigError included).
    """
    check_tokenizer_flags(args)
    prompts = [*args.prompt, *(_read_prompt_file(args.prompt_file) if args.prompt_file else [])]
    sampling = SamplingConfig(greedy=args.greedy, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p)
    config = GenerateConfig(load=args.load, no_verify=args.no_verify, prompts=prompts, prompt_ids=[_parse_ids(t) for t in args.prompt_ids],
                            tokenizer=tokenizer_config_from_args(args), sampling=sampling,
                            max_new_tokens=args.max_new_tokens, seed=args.seed, batch_size=args.batch_size,
                            tensor_model_parallel_size=args.tensor_model_parallel_size,
                            pipeline_model_parallel_size=args.pipeline_model_parallel_size,
                            expert_model_parallel_size=args.expert_model_parallel_size, device=args.device)
    return config, launch_config_from_args(args)


def _generate_records(config: GenerateConfig) -> list[dict]:
    """Every prompt's `Completion`, as a dict (collective over every process of the run)."""
    return [asdict(c) for c in spec_for_source(config.load).generate(config)]


# The header lines of a completion's two parts in the text output.
PROMPT_HEADER = "--- prompt {} ---"
CONTINUATION_HEADER = "--- continuation {} ---"
COMMAND = CollectiveCommand(prog=PROG, build_parser=build_parser, run=_generate_records, check=check_generation)


def format_completion(record: dict, as_json: bool, number: int = 1) -> str:
    """A `Completion` (as a dict) as one JSON line, or as its prompt and continuation under two header lines
    (ids without a tokenizer): a continuation that starts with, or holds, blank lines stays readable."""
    if as_json:
        return json.dumps(record, ensure_ascii=False)
    prompt = record["prompt"] if isinstance(record["prompt"], str) else " ".join(map(str, record["prompt"]))
    continuation = record["text"] if record["text"] is not None else " ".join(map(str, record["ids"]))
    return f"{PROMPT_HEADER.format(number)}\n{prompt}\n{CONTINUATION_HEADER.format(number)}\n{continuation}"


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` (default: the command line), generate (or launch the processes that do), print."""
    args = build_parser().parse_args(argv)
    try:
        config, launch_config = config_from_args(args)
    except ValueError as error:
        COMMAND.fail(str(error))
        return EXIT_USAGE
    try:
        spec = spec_for_source(config.load)
    except REPORTED_ERRORS as error:
        COMMAND.fail(str(error))
        return EXIT_ERROR
    if launch_config.num_gpus_per_node > 1 and not spec.parallel_generation:
        COMMAND.fail(f"{spec.name} generation runs in one process: use --nproc-per-node 1")
        return EXIT_USAGE
    status, completions = run_collective(COMMAND, config, launch_config, config.device)
    for number, completion in enumerate(completions or [], start=1):
        print(format_completion(completion, args.json, number))
    return status
