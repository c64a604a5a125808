"""Running a command: our errors as one line, Ctrl-C and SIGTERM as one line and exit code 130 / 143.

    def main(argv=None) -> int:
        return run_command("convert", lambda: do_the_work(argv))

Every tokenmill command (preprocess-data, inspect-index, merge-datasets, convert, build-indices) runs
through `run_command`; it lives in the lowest room so that every room's commands share it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from types import FrameType

from .cli_parser import EXIT_USAGE
from .errors import REPORTED_ERRORS

EXIT_ERROR = 1
# The shell's convention for a process ended by a signal: 128 + the signal number (SIGINT 130, SIGTERM 143).
EXIT_SIGNAL_BASE = 128
HANDLED_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(BaseException):
    """SIGTERM (or SIGINT) received: raised in the main thread so that every `finally` and writer abort
    runs, as for Ctrl-C. A BaseException, like KeyboardInterrupt, so that no `except Exception`
    swallows it."""

    def __init__(self, signal_number: int) -> None:
        super().__init__(signal.Signals(signal_number).name)
        self.signal_number = signal_number


@dataclasses.dataclass
class _Deferral:
    """Whether interruptions are being held (`signals_deferred`) and the signal that came meanwhile."""

    depth: int = 0
    pending: int | None = None


# Process-wide, like the signal handlers that read it.
_deferral = _Deferral()


def _raise_interrupted(signal_number: int, frame: FrameType | None) -> None:
    # A second Ctrl-C or SIGTERM must not cut the clean-up the first one started.
    for handled in HANDLED_SIGNALS:
        signal.signal(handled, signal.SIG_IGN)
    if _deferral.depth:
        _deferral.pending = signal_number
        return
    raise Interrupted(signal_number)


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """Hold an interruption (under `run_command`'s handlers) until the block ends, then raise it.

    For the few steps between creating temporary files and registering what removes them (a writer's
    constructor and the `with` that will abort it): an interruption there would leave them behind.
    (Blocking the signals with `pthread_sigmask` is not enough: another thread, numpy's BLAS pool for
    one, would receive them, and the main thread would still raise at once.)
    """
    _deferral.depth += 1
    try:
        yield
    finally:
        _deferral.depth -= 1
    if not _deferral.depth and _deferral.pending is not None:
        signal_number, _deferral.pending = _deferral.pending, None
        raise Interrupted(signal_number)


def run_command(prog: str, command: Callable[[], int], *, value_error_exit: int = EXIT_USAGE) -> int:
    """Run `command`; our errors become `prog: error: message` on stderr and a non-zero exit code.

    Args:
        prog: the command's name, first on every error line.
        command: does the work; returns the exit code.
        value_error_exit: exit code of a ValueError (config validation: a bad flag value); the usage
            code 2 by default, 1 for the commands that have always reported bad values with 1
            (convert, build-indices).

    An OSError (a full disk, an unreadable file) names its file in its message and exits 1; a bug
    elsewhere still shows its traceback. SIGINT (Ctrl-C) and SIGTERM unwind the command (its writers
    remove what they wrote) and end it with one line and exit code 130 or 143.
    """
    previous = {}
    _deferral.pending = None
    if threading.current_thread() is threading.main_thread():  # signal handlers can only be set there
        previous = {handled: signal.signal(handled, _raise_interrupted) for handled in HANDLED_SIGNALS}
    try:
        return command()
    except REPORTED_ERRORS as error:
        print(f"{prog}: error: {error}", file=sys.stderr)
        return EXIT_ERROR
    except ValueError as error:
        print(f"{prog}: error: {error}", file=sys.stderr)
        return value_error_exit
    except KeyboardInterrupt:
        return _interrupted(prog, signal.SIGINT)
    except Interrupted as interruption:
        return _interrupted(prog, interruption.signal_number)
    finally:
        for handled, handler in previous.items():
            signal.signal(handled, handler)


def _interrupted(prog: str, signal_number: int) -> int:
    name = signal.Signals(signal_number).name
    print(f"{prog}: interrupted ({name}); nothing half-written was left", file=sys.stderr)
    return EXIT_SIGNAL_BASE + signal_number
