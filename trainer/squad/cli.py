"""Flags shared by ``finetune --task squad`` (`trainer.squad.finetune_cli`) and ``predict``
(`trainer.squad.predict_cli`): the features and the decoding."""

from __future__ import annotations

import argparse

from trainer.squad.features import FeatureOptions


def add_feature_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = FeatureOptions()
    group = parser.add_argument_group("features and decoding (Hugging Face run_qa's)")
    group.add_argument("--max-seq-length", type=int, default=defaults.max_seq_length)
    group.add_argument("--doc-stride", type=int, default=defaults.doc_stride,
                       help="tokens shared by consecutive windows of a long context")
    group.add_argument("--max-query-length", type=int, default=defaults.max_query_length)
    group.add_argument("--n-best-size", type=int, default=20)
    group.add_argument("--max-answer-length", type=int, default=30, help="in tokens")
    group.add_argument("--vocab-file", help="WordPiece vocab.txt (default: the model directory's)")
    case = group.add_mutually_exclusive_group()
    case.add_argument("--lower-case", dest="lower_case", action="store_true", default=None)
    case.add_argument("--no-lower-case", dest="lower_case", action="store_false")
    group.add_argument("--device", choices=("cpu", "cuda"))


def feature_options(args: argparse.Namespace) -> FeatureOptions:
    return FeatureOptions(max_seq_length=args.max_seq_length, doc_stride=args.doc_stride,
                          max_query_length=args.max_query_length)
