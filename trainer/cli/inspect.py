"""`inspect-index`: what a `.bin/.idx` pair holds, whether it is sound, and what its documents say.

    inspect-index out/corpus_text_document                 # header, counts, lengths, max id
    inspect-index out/corpus_text_document --validate      # exit 1 on any inconsistency
    inspect-index out/corpus_text_document --show 3 --tokenizer-type GPT2BPETokenizer \
        --vocab-file gpt2-vocab.json --merge-file gpt2-merges.txt
    inspect-index out/corpus_text_document --seq-length 2048 --split 949,50,1 --seed 1234 \
        --train-samples 100000 --samples 0,1,-1 [tokenizer flags]   # what training will see
    inspect-index out/corpus_text_document --seq-length 2048 --plot corpus.png   # histograms + split layout

The dataset report is `indexed_dataset.inspect`'s. The training view (`--seq-length`) is `samplers.view`'s:
the sample kind `--model` names computes and prints it; this command, which may import both samplers and
the tokenizers, only hands the kind the run's tokenizer. The index cache defaults to `index-cache/` beside
the data, the one training uses (`--data-cache-path` shows exactly a run's own indices); where that
directory is not writable the indices are built in memory (samplers' rule).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass

from indexed_dataset.cli_parser import CommandParser, finite_float, int_at_least, seed_value
from indexed_dataset.cli_support import run_command
from indexed_dataset.figures import figure_format
from indexed_dataset.format import data_file_path, index_file_path
from indexed_dataset.inspect import DatasetReport, decode_documents, inspect_dataset, validate_dataset
from indexed_dataset.path_rules import refuse_output_over_inputs
from preprocess.tokenizers import Tokenizer, TokenizerConfig, TokenizerError, build_tokenizer
from preprocess.tokenizers.flags import add_tokenizer_arguments, tokenizer_config_from_args
from samplers.splits import DEFAULT_SPLIT
from samplers.view import (
    DEFAULT_DECODER_SEQ_LENGTH,
    DEFAULT_MASK_PROB,
    DEFAULT_SEED,
    DEFAULT_VOCAB_EXTRA_IDS,
    SAMPLE_KINDS,
    TrainingViewConfig,
    ViewTokens,
    sample_kind,
)

from trainer.metrics.inspect_plot import plot_inspection
from trainer.models.view_vocabulary import view_vocabulary

PROG = "inspect-index"


@dataclass(kw_only=True, slots=True, frozen=True)
class InspectConfig:
    """One inspect-index call."""

    path: str | None
    """Dataset prefix, or its .bin/.idx path (None: only the training view of `data_path`)."""
    validate: bool = False
    """Run the full consistency check."""
    documents: tuple[int, ...] = ()
    """Documents to decode."""
    tokenizer: TokenizerConfig | None = None
    """Tokenizer for decoding (and the vocab-size check of --validate)."""
    as_json: bool = False
    """Print JSON instead of text."""
    training: TrainingViewConfig | None = None
    """Also show what training with this sampling configuration sees."""
    data_path: tuple[str, ...] = ()
    """The training view's blend, as `train --data-path` ("A B" or "0.3 A 0.7 B"); default `path`."""
    plot: str | None = None
    """Also draw the histograms (and the training view's layout) into this .png/.svg (`inspect_plot`)."""

    def __post_init__(self) -> None:
        if self.path is None and not (self.data_path and self.training is not None):
            raise ValueError("give a dataset path, or --data-path with --seq-length (the training view of a blend)")
        if self.path is None and (self.validate or self.documents):
            raise ValueError("--validate, --show and --docs need a dataset path")
        if self.documents and self.tokenizer is None:
            raise ValueError("decoding documents needs the tokenizer flags (--tokenizer-type ...)")


def _parse_indices(text: str) -> list[int]:
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser(prog=PROG, description=__doc__.splitlines()[0])
    parser.add_argument("path", metavar="PREFIX_OR_IDX", nargs="?",
                        help="dataset prefix, or its .bin/.idx path (optional with --data-path)")
    parser.add_argument("--validate", action="store_true", help="full consistency check; exit 1 on any problem")
    parser.add_argument("--show", type=int_at_least(0), default=0, metavar="N", help="decode the first N documents")
    parser.add_argument("--docs", type=_parse_indices, default=[], metavar="I,J,...", help="decode these documents")
    parser.add_argument("--json", dest="as_json", action="store_true", help="print JSON")
    parser.add_argument("--plot", metavar="PICTURE",
                        help="also draw document-length and token-frequency histograms (and, with --seq-length, the "
                             "splits' epoch/sample layout) into this .png or .svg; needs matplotlib")
    training = parser.add_argument_group("training view (what a GPT run sees; needs --seq-length)")
    training.add_argument("--seq-length", type=int, help="tokens per sample")
    training.add_argument("--data-path", nargs="+", default=[], metavar="[WEIGHT] PATH",
                          help="show the training view of this blend, as train --data-path (default: the dataset)")
    training.add_argument("--split", default=DEFAULT_SPLIT, help=f"split weights (default {DEFAULT_SPLIT})")
    training.add_argument("--seed", type=seed_value, default=DEFAULT_SEED,
                          help=f"shuffle seed (default {DEFAULT_SEED})")
    sizes = training.add_mutually_exclusive_group()
    sizes.add_argument("--num-samples", type=int_at_least(0), nargs=3, metavar=("TRAIN", "VALID", "TEST"),
                       help="samples per split (default: one epoch each)")
    for name in ("train", "valid", "test"):
        sizes.add_argument(f"--{name}-samples", type=int_at_least(0),
                           help=f"samples of the {name} split (default: one epoch)")
    training.add_argument("--samples", type=_parse_indices, default=[0], metavar="I,J,...",
                          help="samples to show per split, negative from the end (default 0)")
    training.add_argument("--data-cache-path", help="index cache directory (default: index-cache/ beside the data)")
    training.add_argument("--model", choices=list(SAMPLE_KINDS), default="gpt",
                          help="show a T5 run's span-corruption samples (sentence-split data, needs the tokenizer; "
                               "--seq-length is the encoder length) or a BERT run's masked-LM samples "
                               "(sentence-split WordPiece data, needs the tokenizer)")
    training.add_argument("--decoder-seq-length", type=int, default=DEFAULT_DECODER_SEQ_LENGTH,
                          help=f"T5 decoder positions (default {DEFAULT_DECODER_SEQ_LENGTH})")
    training.add_argument("--vocab-extra-ids", type=int, default=DEFAULT_VOCAB_EXTRA_IDS,
                          help=f"T5 sentinels added to a vocabulary without any (default {DEFAULT_VOCAB_EXTRA_IDS})")
    training.add_argument("--mask-prob", type=finite_float, default=DEFAULT_MASK_PROB,
                          help=f"BERT: fraction of a sample's tokens masked (default {DEFAULT_MASK_PROB})")
    training.add_argument("--bert-no-binary-head", action="store_true",
                          help="BERT: masked LM alone, one segment per sample (no sentence-order label)")
    add_tokenizer_arguments(parser, required=False)
    return parser


def _training_config(args: argparse.Namespace) -> TrainingViewConfig | None:
    if args.seq_length is None:
        return None
    sizes = args.num_samples or [args.train_samples, args.valid_samples, args.test_samples]
    return TrainingViewConfig(sequence_length=args.seq_length, split=args.split, seed=args.seed, sizes=tuple(sizes),
                              sample_ids=tuple(args.samples), path_to_cache=args.data_cache_path, model=args.model,
                              decoder_sequence_length=args.decoder_seq_length, vocab_extra_ids=args.vocab_extra_ids,
                              mask_prob=args.mask_prob, binary_head=not args.bert_no_binary_head)


def _format(report: DatasetReport) -> str:
    lines = [
        f"dataset         {report.prefix}",
        f"format          {report.format}",
        f"version         {report.version}",
        f"dtype           {report.dtype}",
        f"sequences       {report.sequences}",
        f"documents       {report.documents} ({report.empty_documents} empty)",
        f"tokens          {report.tokens}",
        f"max id          {report.max_token_id}",
        "bytes           " + ", ".join(f"{os.path.basename(name)} {size}" for name, size in report.files.items()),
    ]
    for name, stats in (("sequence", report.sequence_lengths), ("document", report.document_lengths)):
        lines.append(f"{name + ' length':<16}min {stats.min}, mean {stats.mean:.1f}, median {stats.median:.1f}, "
                     f"p99 {stats.p99:.1f}, max {stats.max}")
    return "\n".join(lines)


def _refuse_plot_over_inputs(config: InspectConfig, dataset_files: list[str]) -> None:
    """`--plot` must not name a file the call reads: the dataset's, a blend's, the tokenizer's.

    Raises:
        TokenmillError: naming the picture and the input.
    """
    blend = [file for word in config.data_path for file in (word, data_file_path(word), index_file_path(word))]
    tokenizer_files = config.tokenizer.files() if config.tokenizer is not None else []
    refuse_output_over_inputs([config.plot], [*dataset_files, *blend, *tokenizer_files])


def run_inspect(config: InspectConfig) -> int:
    """Print the report (and decoded documents); returns the exit code."""
    if config.path is None:
        return _run_blend_view(config)
    report = inspect_dataset(config.path)
    if config.plot is not None:
        _refuse_plot_over_inputs(config, list(report.files))
    tokenizer = build_tokenizer(config.tokenizer) if config.tokenizer is not None else None
    if config.validate:
        validate_dataset(config.path, tokenizer)
    decoded = decode_documents(config.path, tokenizer, list(config.documents)) if config.documents else {}
    view = None
    if config.training is not None:
        blend = config.data_path if sample_kind(config.training.model).blends else ()
        view = _training_view(config, blend or report.prefix, tokenizer)
    if config.as_json:
        output = report.as_dict()
        if config.validate:
            output["valid"] = True
        output["decoded"] = {str(index): text for index, text in decoded.items()}
        if view is not None:
            output["training"] = _training_json(config.training, view)
        print(json.dumps(output, indent=2, ensure_ascii=False))
    else:
        print(_format(report))
        if config.validate:
            print("valid           yes")
        for index, text in decoded.items():
            print(f"--- document {index} ---\n{text}")
        if view is not None:
            print(sample_kind(config.training.model).module().format_training_view(view, config.training))
    if config.plot is not None:
        training = config.training
        _say_written(plot_inspection(config.plot, config.path, view, training.sequence_length if training else 0,
                                     training.sizes if training else ()))
    return 0


def _say_written(picture: os.PathLike) -> None:
    """One line on stderr (stdout holds the report, maybe JSON), as plot-metrics says it."""
    sys.stderr.write(f"wrote {picture}\n")


def _training_json(training: TrainingViewConfig, view: list) -> dict:
    return {"sequence_length": training.sequence_length, "split": training.split, "seed": training.seed,
            "splits": view}


def _training_view(config: InspectConfig, data: str | tuple[str, ...], tokenizer: Tokenizer | None) -> list:
    """The training view of `data` (a dataset path or blend words) by the sample kind `--model` names.

    Raises:
        TokenizerError: the kind needs the tokenizer and none was given.
    """
    training = config.training
    kind = sample_kind(training.model)
    if kind.tokenizer_use is not None and tokenizer is None:
        raise TokenizerError(f"--model {kind.name} needs the tokenizer ({kind.tokenizer_use})")
    view_tokens = None
    if tokenizer is not None:
        tokenizer_type = config.tokenizer.tokenizer_type
        view_tokens = ViewTokens(decode=tokenizer.decode,
                                 vocabulary=lambda extra_ids: view_vocabulary(tokenizer, tokenizer_type, extra_ids))
    view = kind.module().training_view(data, training, view_tokens)
    _refuse_unseen_samples(view, training.sample_ids)
    return view


def _refuse_unseen_samples(view: list[dict | None], sample_ids: tuple[int, ...]) -> None:
    """Each split shows the ``--samples`` ids it has; an id that no split has would show nothing at all.

    Raises:
        ValueError: naming the id and each split's sample count.
    """
    counts = {split["split"]: split["num_samples"] for split in view if split is not None}
    for sample_id in sample_ids:
        if not any(-count <= sample_id < count for count in counts.values()):
            have = ", ".join(f"{name} {count}" for name, count in counts.items()) or "none"
            raise ValueError(f"--samples {sample_id}: no split has that sample (samples per split: {have})")


def _run_blend_view(config: InspectConfig) -> int:
    """Print only the training view of `config.data_path` (no dataset summary: a blend has several)."""
    kind = sample_kind(config.training.model)
    if not kind.blends:
        raise ValueError(f"--model {kind.name} trains on one dataset: give its path, not --data-path")
    if config.plot is not None:
        _refuse_plot_over_inputs(config, [])
    tokenizer = build_tokenizer(config.tokenizer) if config.tokenizer is not None else None
    view = _training_view(config, config.data_path, tokenizer)
    if config.as_json:
        print(json.dumps({"training": _training_json(config.training, view)}, indent=2, ensure_ascii=False))
    else:
        print(kind.module().format_training_view(view, config.training))
    if config.plot is not None:
        _say_written(plot_inspection(config.plot, None, view, config.training.sequence_length, config.training.sizes))
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run inspect-index with `argv` (default: sys.argv[1:]); returns the exit code."""
    args = build_parser().parse_args(argv)

    def command() -> int:
        if args.plot is not None:
            figure_format(args.plot)  # a wrong suffix is refused before the report, not after it
        shown = list(range(args.show)) + [index for index in args.docs if index >= args.show]
        config = InspectConfig(path=args.path, validate=args.validate, documents=tuple(shown),
                               tokenizer=tokenizer_config_from_args(args), as_json=args.as_json,
                               training=_training_config(args), data_path=tuple(args.data_path),
                               plot=args.plot)
        return run_inspect(config)

    return run_command(PROG, command)


if __name__ == "__main__":
    raise SystemExit(main())
