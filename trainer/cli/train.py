"""``train``: a thin GPT and T5 trainer with data, tensor and pipeline parallelism.

    # one process, on the bundled sample data
    train --dataset data_test/megatron/sample_en_eod_text_document --vocab-file data_test/gpt2/gpt2-vocab.json \\
          --merge-file data_test/gpt2/gpt2-merges.txt --num-layers 2 --hidden-size 64 --num-attention-heads 4 \\
          --seq-length 64 --micro-batch-size 4 --global-batch-size 8 --train-iters 20 --device cpu

    # 4 CPU processes, data x tensor parallel (train launches them itself, as torchrun would)
    train ... --nproc-per-node 4 --tensor-model-parallel-size 2 --device cpu

    # start from a Hugging Face GPT-2 directory: its shape and tokenizer files are the defaults
    train --load-hf gpt2/ --dataset data/my_text_document --seq-length 1024 --micro-batch-size 4 --save ckpt/run1

    # T5 span corruption on a sentence-split dataset (preprocess-data --split-sentences)
    train --model t5 --dataset data/my_text_sentence --tokenizer-type SentencePieceTokenizer \
          --tokenizer-model sp.model --vocab-extra-ids 100 --encoder-seq-length 512 --decoder-seq-length 128 \
          --num-layers 12 --hidden-size 768 --num-attention-heads 12 --ffn-hidden-size 3072 ...

With more than one process ``train`` starts them through torch's elastic launcher; under a torchrun
the user started it just joins the group.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Iterator

import torch
from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ErrorHandler

from indexed_dataset.cli_support import Interrupted, run_command
from indexed_dataset.errors import REPORTED_ERRORS
from preprocess.tokenizers.config import TOKENIZER_FILE_FIELDS
from samplers.mock import MOCK_SPLIT
from trainer.cli.train_args import build_parser, config_from_args, environment_defaults, option_name
from trainer.cli.flags import flags_in_message
from trainer.config import CheckpointConfig, PrecisionConfig, TrainConfig
from trainer.cli.config_file import argv_with_config_file
from trainer.data.batches import check_data_files
from trainer.parallel.distributed import launch, under_launcher
from trainer.errors import CollectiveTimeoutError, TrainConfigError
from trainer.checkpoint.store import check_load_path
from trainer.models.dispatch import checkpoint_train_defaults
from trainer.parallel.dims import resolve_parallel_dims
from trainer.models import model_spec, spec_for_hf_directory, unused_fields
from trainer.train import train

PROG = "train"
EXIT_ERROR = 1
EXIT_USAGE = 2
# Loggers that report a failed worker with a multi-line traceback of the launcher itself.
LAUNCHER_LOGGERS = ("torch.distributed.elastic.multiprocessing.api", "torch.multiprocessing.spawn")
# DTensor warns, once per process, that a (dp, tp) reduction of a replicated value takes two all-reduces
# instead of one on a flattened mesh: a performance note that is the same on every rank, so only
# rank 0 shows it.
PER_RANK_DUPLICATE_LOGGERS = ("torch.distributed.tensor._redistribute",)
logger = logging.getLogger(__name__)


def _setup_logging(rank: int, level: int | None = None) -> None:
    """INFO on rank 0, warnings only elsewhere: only rank 0 writes the log. ``level`` (--logging-level) replaces
    rank 0's INFO, and the other ranks' WARNING when it is higher."""
    logging.basicConfig(level=logging.INFO if rank == 0 else logging.WARNING, format="%(message)s")
    if rank == 0 and level is not None:
        logging.getLogger().setLevel(level)
    if rank != 0:
        logging.getLogger().setLevel(max(level or logging.WARNING, logging.WARNING))
        for name in PER_RANK_DUPLICATE_LOGGERS:
            logging.getLogger(name).setLevel(logging.ERROR)


def _fail(message: str) -> None:
    sys.stderr.write(f"{PROG}: error: {flags_in_message(message, build_parser())}\n")


def _run(config: TrainConfig) -> int:
    """Train in this process (alone or under torchrun); our own errors become one line on stderr,
    written by rank 0 (a collective's timeout by the rank that waited: the others may be the stalled ones)."""
    rank = int(os.environ.get("RANK", "0"))
    _setup_logging(rank, config.observability.logging_level)
    try:
        train(config)
    except REPORTED_ERRORS as error:
        if rank == 0 or isinstance(error, CollectiveTimeoutError):
            _fail(str(error))
        return EXIT_ERROR
    return 0


def _worker(config: TrainConfig) -> int:
    """Entry point of each process `main` launches.

    Our own errors go to the elastic error file instead of stderr: the launcher may kill the other
    workers at the first failure, so the parent, which sees the first failure's message, prints it.
    """
    if config.training.device != "cuda" and "OMP_NUM_THREADS" not in os.environ:
        # What torchrun does for several processes per node: one intra-op thread each.
        torch.set_num_threads(1)
    signal.signal(signal.SIGINT, _interrupt_once)
    _setup_logging(int(os.environ.get("RANK", "0")), config.observability.logging_level)
    try:
        train(config)
    except REPORTED_ERRORS as error:
        ErrorHandler().record_exception(error)
        raise SystemExit(EXIT_ERROR) from None
    return 0


def _interrupt_once(signal_number: int, frame: object) -> None:
    """A worker's SIGINT: KeyboardInterrupt the first time (train saves nothing half-written and torch's worker
    wrapper ends the process quietly), ignored after. A terminal's Ctrl-C reaches the whole process group and the
    launcher forwards it to its workers again: that second one must cut neither the first one's cleanup nor, once
    the worker has returned, its exit (a KeyboardInterrupt there prints multiprocessing's traceback)."""
    signal.signal(signal_number, signal.SIG_IGN)
    raise KeyboardInterrupt


def _failure_message(error: ChildFailedError) -> str:
    """The first failed worker's own message (``"TrainConfigError: ..."`` minus the type)."""
    rank, failure = error.get_first_failure()
    message = failure.message
    if isinstance(message, dict):  # the error file's {"message": ..., "extraInfo": ...}
        message = message.get("message", "")
    if failure.exitcode < 0:  # (torch records "Signal 9 (SIGKILL) received by PID ...": not which rank)
        return f"worker rank {rank} was killed by {failure.signal_name()}; see its output above"
    if failure.error_file_data and message:
        return message.split(": ", 1)[-1]
    return f"worker rank {rank} failed with exit code {failure.exitcode}; see its output above"


def _parser_for(argv: list[str] | None) -> argparse.ArgumentParser:
    """The ``train`` parser; with ``--load-hf DIR`` its defaults for the model (GPT-2, or T5/mT5 with
    ``--model t5``) and the tokenizer files come from DIR, with ``--load CHECKPOINT`` from the
    checkpoint's model_config.json and tokenizer files (flags the user gives still win).

    Raises:
        TokenmillError: DIR is not a convertible Hugging Face GPT-2, T5 or mT5 directory.
    """
    parser = build_parser()
    parser.set_defaults(**environment_defaults())
    known, _ = parser.parse_known_args(argv)
    CheckpointConfig(load=known.load, load_hf=known.load_hf)  # its rules (one source of weights) before either is read
    sections = {}
    if known.load_hf is not None:
        sections = spec_for_hf_directory(known.load_hf).hf_train_defaults(known.load_hf)
    elif known.load is not None:
        check_load_path(known.load, known.save)
        sections = checkpoint_train_defaults(known.load)
    # A tokenizer the user names replaces the stored one whole: mixing its files with the stored ones
    # (a WordPiece vocab beside an spiece.model) would build neither.
    own_tokenizer = any(getattr(known, name) != parser.get_default(name) for name in TOKENIZER_FILE_FIELDS)
    for values in sections.values():
        parser.set_defaults(**{name: value for name, value in values.items()
                               if not (own_tokenizer and name in TOKENIZER_FILE_FIELDS)})
    return parser


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` (default: the command line), then train or launch the workers that do.

    Ctrl-C and SIGTERM end it with one line and exit code 130 / 143 (`run_command`); checkpoints are
    written under temporary names, so the last complete one is what stays.
    """
    return run_command(PROG, lambda: _main(argv))


def _main(argv: list[str] | None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        argv = argv_with_config_file(argv, build_parser())
        parser = _parser_for(argv)
    except REPORTED_ERRORS as error:
        _fail(str(error))
        return EXIT_USAGE
    args = parser.parse_args(argv)
    try:
        config = config_from_args(args)  # first: a value out of range is wrong whatever the family
        refuse_unused_flags(argv, args.model)
    except REPORTED_ERRORS as error:
        _fail(str(error))
        return EXIT_USAGE
    rank = int(os.environ.get("RANK", "0"))
    _setup_logging(rank, config.observability.logging_level)
    if rank == 0:
        _warn_about(config, args)
        for line in checkpoint_overrides(argv, args):
            logger.warning("%s", line)
    num_processes = config.launch.num_gpus_per_node * config.launch.num_nodes
    if num_processes == 1 or under_launcher():
        return _run(config)
    try:
        # Fail here, before any process starts, on what the workers would all reject.
        resolve_parallel_dims(config, num_processes, model_spec(config.model.model).layout_rules)
        check_data_files(config.data)
    except REPORTED_ERRORS as error:
        _fail(str(error))
        return EXIT_ERROR
    try:
        training = config.training
        with _quiet_launcher_logs():
            launch(config.launch, _worker, config,
                   forward_signal=signal.Signals[training.exit_signal] if training.exit_signal_handler else None)
    except ChildFailedError as error:
        restarts = config.launch.max_restarts
        after = f" (after {restarts} restart{'s' if restarts > 1 else ''}, max_restarts)" if restarts else ""
        _fail(_failure_message(error) + after)
        return EXIT_ERROR
    except SignalException as error:  # the launcher's own SIGTERM/SIGINT handler: the workers are stopped
        raise Interrupted(error.sigval) from None
    except REPORTED_ERRORS as error:  # the nodes never met (a rendezvous timeout)
        _fail(str(error))
        return EXIT_ERROR
    return 0


def given_fields(argv: list[str]) -> set[str]:
    """The `TrainConfig` fields the flags of ``argv`` set (aliases included), whatever their values: what the
    user gave, unlike defaults (a ``--load-hf`` directory's, the environment's)."""
    parser = build_parser()
    for action in parser._actions:  # (not set_defaults: argparse would type-convert its "==SUPPRESS==")
        action.default = argparse.SUPPRESS
    known, _ = parser.parse_known_args(argv)
    return set(vars(known))


def checkpoint_overrides(argv: list[str], args: argparse.Namespace) -> list[str]:
    """One line for each flag of ``argv`` whose value differs from the checkpoint ``--load`` names: ``--load``
    takes every model setting (sequence lengths included) from the checkpoint, so only a flag the user gives
    contradicts it, and says so."""
    if args.load is None or args.load_hf is not None:
        return []
    given = given_fields(argv)
    return [f"warning: {option_name(name)} {getattr(args, name)} overrides the checkpoint's {value} ({args.load})"
            for values in checkpoint_train_defaults(args.load).values() for name, value in values.items()
            if name in given and getattr(args, name) != value]


def refuse_unused_flags(argv: list[str], model: str) -> None:
    """Refuse the flags of ``argv`` that family ``model`` never reads (`trainer.models.unused_fields`): a run that
    ignored them would not be the run the user asked for.

    Raises:
        TrainConfigError: naming every such flag.
    """
    given = given_fields(argv)
    unused = [option_name(name) for name in unused_fields(model) if name in given]
    if unused:
        verb = "does" if len(unused) == 1 else "do"
        raise TrainConfigError(f"{', '.join(unused)} {verb} not apply to model {model}")


# fp16's dynamic loss-scaling settings, which a static --loss-scale makes moot (Megatron's ConstantGradScaler).
DYNAMIC_SCALE_FIELDS = ("initial_loss_scale", "min_loss_scale", "loss_scale_window", "hysteresis")


def _warn_about(config: TrainConfig, args: argparse.Namespace) -> None:
    """Settings that are valid but probably not what was meant, and settings Megatron accepts and gives a
    meaning other than their words (``args``: the flags as given, before the config adjusts them): one
    warning line each."""
    if args.sequence_parallel and args.tensor_model_parallel_size == 1:
        logger.warning("warning: --sequence-parallel has no effect without tensor parallelism "
                       "(--tensor-model-parallel-size 1): turned off, as Megatron does")
    if args.pipeline_model_parallel_size == 0:
        logger.warning("warning: --pipeline-model-parallel-size 0 means 1 (no pipeline), as CPM-Pretrain's "
                       "--pipe-parallel-size 0")
    parallelism = config.parallelism
    if parallelism.use_distributed_optimizer and parallelism.zero_stage > 1:
        logger.warning("warning: --use-distributed-optimizer (ZeRO stage 1) is part of --zero-stage %d: stage %d runs",
                       parallelism.zero_stage, parallelism.zero_stage)
    precision = config.precision
    if precision.loss_scale is not None:
        defaults = PrecisionConfig()
        moot = [option_name(name) for name in DYNAMIC_SCALE_FIELDS
                if getattr(precision, name) != getattr(defaults, name)]
        if moot:
            logger.warning("warning: --loss-scale %g is a static scale, so %s %s no effect (Megatron's rule)",
                           precision.loss_scale, ", ".join(moot), "has" if len(moot) == 1 else "have")
        if precision.bf16:
            logger.warning("warning: --loss-scale %g with --bf16 multiplies the loss by a constant, as Megatron does "
                           "(bf16 needs no loss scaling)", precision.loss_scale)
    if config.data.mock_data and args.split not in (None, MOCK_SPLIT):
        logger.warning("warning: --split %s has no effect with --mock-data: Megatron divides its mock documents "
                       "%s among train, valid and test", args.split, MOCK_SPLIT)
    if config.logging.eval_iters > 0 and config.data.split_is_empty("valid"):
        cause = (f"--split {config.data.split} gives the valid split no data" if config.data.split is not None
                 else "no --valid-data-path is given")
        logger.warning("warning: %s, so no evaluation runs (--eval-interval %d has no effect); set --eval-iters 0 "
                       "to say so", cause, config.logging.eval_interval)


@contextlib.contextmanager
def _quiet_launcher_logs() -> Iterator[None]:
    """Hide the launcher's own tracebacks of a failed worker: `main` reports the failure in one line.
    (An unexpected exception still prints its traceback from the worker itself.)"""
    loggers = [logging.getLogger(name) for name in LAUNCHER_LOGGERS]
    levels = [launcher_logger.level for launcher_logger in loggers]
    for launcher_logger in loggers:
        launcher_logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for launcher_logger, level in zip(loggers, levels):
            launcher_logger.setLevel(level)


if __name__ == "__main__":  # torchrun --nproc-per-node N -m trainer.cli.train ...
    sys.exit(main())
