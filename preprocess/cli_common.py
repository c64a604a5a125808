"""What every preprocess-room CLI shares: logging setup and turning our errors into one line."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable

from indexed_dataset.errors import REPORTED_ERRORS

logger = logging.getLogger("preprocess")

EXIT_ERROR = 1
EXIT_USAGE = 2


def setup_logging() -> None:
    """Plain `message` lines on stderr; our loggers at INFO (also when a host already configured logging)."""
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    logger.setLevel(logging.INFO)


def run_command(prog: str, command: Callable[[], int]) -> int:
    """Run `command`; our errors become `prog: error: message` on stderr and a non-zero exit code.

    ValueError comes from config validation (a bad flag value) and exits with the usage code; an
    OSError (a full disk, an unreadable file) names its file in its message; a bug elsewhere still
    shows its traceback.
    """
    try:
        return command()
    except REPORTED_ERRORS as error:
        print(f"{prog}: error: {error}", file=sys.stderr)
        return EXIT_ERROR
    except ValueError as error:
        print(f"{prog}: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print(f"{prog}: interrupted; no output was written", file=sys.stderr)
        return EXIT_ERROR
