"""`convert-checkpoint`: Hugging Face GPT-2, BERT, T5, mT5 and Switch Transformers directories <-> tokenmill
checkpoints (local files only; the tokenizer travels with the weights, written in Hugging Face's form on export).

    # HF -> tokenmill (model only, iteration 0; train --load continues from it)
    convert-checkpoint --from-hf gpt2/ --to checkpoints/gpt2 [--tensor-model-parallel-size 2]
    convert-checkpoint --from-hf mt5-small/ --to checkpoints/mt5   # config.json model_type t5 or mt5
    convert-checkpoint --from-hf bert-base/ --to checkpoints/bert  # model_type bert; switch_transformers too
    # tokenmill -> HF (loads with GPT2LMHeadModel / BertForPreTraining / T5ForConditionalGeneration
    # .from_pretrained, and the tokenizer with AutoTokenizer.from_pretrained)
    convert-checkpoint --from checkpoints/run1 --to-hf gpt2-run1/
    convert-checkpoint --from checkpoints/t5-run --to-hf t5-run/     # a train --model t5 checkpoint
"""

from __future__ import annotations

import argparse
import logging
import sys

from indexed_dataset.cli_parser import CommandParser
from indexed_dataset.errors import REPORTED_ERRORS
from trainer.cli.flags import flags_in_message
from trainer.checkpoint.hf_convert import ConvertCheckpointConfig
from trainer.models.dispatch import convert_checkpoint

PROG = "convert-checkpoint"
EXIT_ERROR = 1
EXIT_USAGE = 2


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser(prog=PROG, description=__doc__)
    hf_in = parser.add_argument_group("import (HF -> tokenmill)")
    hf_in.add_argument("--from-hf", metavar="DIR",
                       help="local HF GPT-2, BERT, T5, mT5 or Switch Transformers directory (config.json + weights, "
                            "tokenizer files copied)")
    hf_in.add_argument("--to", metavar="PATH", help="checkpoint root to create")
    hf_in.add_argument("--make-vocab-size-divisible-by", type=int, metavar="N",
                       help="pad the vocabulary as the train run will (default 128)")
    hf_in.add_argument("--tensor-model-parallel-size", type=int, metavar="N",
                       help="tp degree of the train run that loads it; the padding is a multiple of it (default 1)")
    hf_out = parser.add_argument_group("export (tokenmill -> HF)")
    hf_out.add_argument("--from", dest="from_checkpoint", metavar="PATH",
                        help="checkpoint root (latest iteration) or iter_XXXXXXX directory")
    hf_out.add_argument("--to-hf", metavar="DIR", help="HF directory to write")
    hf_out.add_argument("--num-attention-heads", type=int, help="only for checkpoints without model_config.json")
    hf_out.add_argument("--vocab-size", type=int, help="only for checkpoints without model_config.json")
    hf_out.add_argument("--no-verify", action="store_true",
                        help="read the checkpoint without checking its files against the checksums of its manifest")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` (default: the command line) and convert."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        config = ConvertCheckpointConfig(**vars(args))
    except ValueError as error:
        sys.stderr.write(f"{PROG}: error: {_as_flags(str(error))}\n")
        return EXIT_USAGE
    try:
        convert_checkpoint(config)
    except REPORTED_ERRORS as error:
        sys.stderr.write(f"{PROG}: error: {_as_flags(str(error))}\n")
        return EXIT_ERROR
    return 0



def _as_flags(message: str) -> str:
    """Config field names as the flags a user typed (``to_hf`` -> ``--to-hf``; ``to`` is a plain word)."""
    return flags_in_message(message.replace("(to)", "(--to)"), build_parser())
