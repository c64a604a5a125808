"""Flags shared by ``finetune --task squad`` (`trainer.models.bert.squad.finetune_cli`) and ``predict``
(`trainer.models.bert.squad.predict_cli`): the features and the decoding."""

from __future__ import annotations

import argparse

from indexed_dataset.cli_parser import int_at_least
from trainer.checkpoint.store import resolve_checkpoint
from trainer.checkpoint.hf_files import is_hf_directory
from trainer.models.bert.convert import hf_shape, read_model_config
from trainer.models.bert.squad.features import SPECIAL_POSITIONS, FeatureOptions


def add_feature_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = FeatureOptions()
    group = parser.add_argument_group("features and decoding (Hugging Face run_qa's)")
    group.add_argument("--max-seq-length", type=int,
                       help=f"tokens per window (default {defaults.max_seq_length}, or the loaded model's positions "
                            "when it has fewer; more than the model's positions is refused)")
    group.add_argument("--doc-stride", type=int,
                       help=f"tokens shared by consecutive windows of a long context (default {defaults.doc_stride}, "
                            "or what fits a shorter --max-seq-length)")
    group.add_argument("--max-query-length", type=int,
                       help=f"question tokens kept (default {defaults.max_query_length}, or half a shorter "
                            "--max-seq-length)")
    group.add_argument("--n-best-size", type=int_at_least(1), default=20)
    group.add_argument("--max-answer-length", type=int_at_least(1), default=30, help="in tokens")
    group.add_argument("--vocab-file", help="WordPiece vocab.txt (default: the model directory's)")
    case = group.add_mutually_exclusive_group()
    case.add_argument("--lower-case", dest="lower_case", action="store_true", default=None)
    case.add_argument("--no-lower-case", dest="lower_case", action="store_false")
    group.add_argument("--device", choices=("cpu", "cuda"))


def feature_options(args: argparse.Namespace, positions: int | None = None) -> FeatureOptions:
    """The feature sizes of the flags; those not given are run_qa's defaults, cut to fit a model of
    ``positions`` positions (None: no model to fit, a fresh encoder is built for the sizes).

    Raises:
        ValueError: --max-seq-length is past the model's positions (one line naming both).
    """
    defaults = FeatureOptions()
    length = args.max_seq_length
    if length is None:
        length = defaults.max_seq_length if positions is None else min(defaults.max_seq_length, positions)
    elif positions is not None and length > positions:
        raise ValueError(f"--max-seq-length {length} is past the model's {positions} positions")
    query = args.max_query_length
    if query is None:
        query = min(defaults.max_query_length, length // 2)
    stride = args.doc_stride
    if stride is None:
        # Half the context's room at most, as run_qa's 128 of 384 - 64 - 3.
        stride = max(1, min(defaults.doc_stride, (length - query - SPECIAL_POSITIONS) // 2))
    return FeatureOptions(max_seq_length=length, doc_stride=stride, max_query_length=query)


def model_positions(load: str | None, load_hf: str | None = None) -> int | None:
    """The position count of the BERT a run starts from (a checkpoint or a HF directory); None without one.

    Raises:
        TokenmillError: the model's files are unreadable (one line naming the file).
    """
    source = load_hf or load
    if source is None:
        return None
    if is_hf_directory(source):
        return hf_shape(source).max_position_embeddings
    return read_model_config(resolve_checkpoint(source)[0])["shape"].max_position_embeddings
