"""What the CLIs that run one collective function in this process or in ``--nproc-per-node`` launched workers
share (``generate``, ``evaluate``): their layout flags, the tokenizer-flag check, and `run_collective`, which
runs the function here (one process, or a worker under torchrun) or launches the workers, and turns every
failure into one error line.

    COMMAND = CollectiveCommand(prog="evaluate", build_parser=build_parser, run=evaluate, check=check_evaluation)
    status, record = run_collective(COMMAND, config, launch_config, device=config.model.device)
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

from indexed_dataset.errors import REPORTED_ERRORS
from trainer.cli.flags import flags_in_message
from trainer.config import LaunchConfig
from trainer.parallel.distributed import launch, under_launcher

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
DEFAULT_MASTER_PORT = 29500
# Tokenizer flags that mean nothing without --tokenizer-type (flag -> argparse destination).
_TOKENIZER_OPTIONS = {"--vocab-file": "vocab_file", "--merge-file": "merge_file",
                      "--tokenizer-model": "tokenizer_model", "--vocab-size": "vocab_size"}


def add_layout_arguments(parser: argparse.ArgumentParser) -> None:
    """The "parallelism" flags: tensor/pipeline degrees, processes to start, rendezvous port, device."""
    layout = parser.add_argument_group("parallelism")
    layout.add_argument("--tensor-model-parallel-size", type=int, default=1, help="tensor-parallel degree")
    layout.add_argument("--pipeline-model-parallel-size", type=int, default=1, help="pipeline-parallel degree")
    layout.add_argument("--nproc-per-node", type=int, default=1, help="processes to start on this node")
    layout.add_argument("--master-port", type=int, default=DEFAULT_MASTER_PORT,
                        help="rendezvous port on this machine, with --nproc-per-node > 1")
    layout.add_argument("--device", choices=("cpu", "cuda"), help="default cuda when available")


def launch_config_from_args(args: argparse.Namespace) -> LaunchConfig:
    """The launch settings of `add_layout_arguments`' flags."""
    return LaunchConfig(num_gpus_per_node=args.nproc_per_node, master_port=args.master_port)


def check_tokenizer_flags(args: argparse.Namespace) -> None:
    """Without ``--tokenizer-type`` the model's own tokenizer files are used, so its options must be absent.

    Raises:
        ValueError: naming the options given.
    """
    if args.tokenizer_type is not None:
        return
    given = [flag for flag, dest in _TOKENIZER_OPTIONS.items() if getattr(args, dest) is not None]
    if given or not args.tokenizer_hf_include_special_tokens:
        raise ValueError(f"{', '.join(given) or '--tokenizer-hf-no-include-special-tokens'} needs --tokenizer-type")


@dataclass(frozen=True, slots=True)
class CollectiveCommand:
    """A command's collective function and its checks (module-level functions: workers receive it pickled)."""

    prog: str
    build_parser: Callable[[], argparse.ArgumentParser]
    """The command's parser (error messages name its flags instead of config fields)."""
    run: Callable[[Any], Any]
    """config -> the result rank 0 prints (collective over every process; raises `REPORTED_ERRORS`)."""
    check: Callable[[Any, int], None]
    """(config, world size): raise what every worker would, before any process starts."""

    def fail(self, message: str) -> None:
        """Write ``message`` as the command's one error line, config field names written as its flags."""
        sys.stderr.write(f"{self.prog}: error: {flags_in_message(message, self.build_parser())}\n")

    def run_here(self, config: Any) -> Any | None:
        """``run`` in this process; None after rank 0 wrote the error line."""
        logging.basicConfig(level=logging.WARNING, format="%(message)s")
        try:
            return self.run(config)
        except REPORTED_ERRORS as error:
            if _rank() == 0:
                self.fail(str(error))
            return None


def _rank() -> int:
    return int(os.environ.get("RANK", "0"))


def _worker(command: CollectiveCommand, config: Any, device: str | None) -> Any:
    """Entry point of each launched process; its result goes back to the launcher."""
    if device != "cuda" and "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(1)  # what torchrun does for several processes per node
    result = command.run_here(config)
    if result is None:
        raise SystemExit(EXIT_ERROR)
    return result


def _launch(command: CollectiveCommand, config: Any, launch_config: LaunchConfig, device: str | None) -> Any | None:
    """Start the workers; rank 0's result, or None after writing the error line."""
    try:
        # Fail here, before any process starts, on what the workers would all reject.
        command.check(config, launch_config.num_gpus_per_node)
        return launch(launch_config, _worker, command, config, device)[0]
    except ChildFailedError as error:
        failed = sorted(error.failures)  # global rank -> ProcessFailure
        if 0 not in failed:  # rank 0 wrote its own line
            command.fail(f"worker rank(s) {failed} failed; see their output above")
        return None
    except REPORTED_ERRORS as error:  # a bad model or layout, or the rendezvous failed (its port taken)
        command.fail(str(error))
        return None


def run_collective(command: CollectiveCommand, config: Any, launch_config: LaunchConfig, device: str | None,
                   verbose: bool = True) -> tuple[int, Any | None]:
    """Run ``command`` here (one process, or this worker under torchrun) or launch its workers.

    Args:
        device: the run's device flag (cpu workers get one torch thread each, as torchrun gives them).
        verbose: the launcher logs at INFO (which processes start).

    Returns:
        (exit status, the result to print: rank 0's; None on the other ranks and after an error line).
    """
    if launch_config.num_gpus_per_node == 1 or under_launcher():
        result = command.run_here(config)
        if result is None:
            return EXIT_ERROR, None
        return EXIT_OK, result if _rank() == 0 else None
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, format="%(message)s")
    result = _launch(command, config, launch_config, device)
    return (EXIT_ERROR, None) if result is None else (EXIT_OK, result)
