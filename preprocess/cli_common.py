"""What every preprocess-room CLI shares: logging setup and turning our errors into one line."""

from __future__ import annotations

import logging
import sys

# One implementation of the error/interruption handling for every room's commands (samplers may not
# import preprocess, so it lives in indexed_dataset); re-exported here for preprocess's commands.
from indexed_dataset.cli_support import run_command  # noqa: F401  (used by the preprocess CLIs)

logger = logging.getLogger("preprocess")


def setup_logging() -> None:
    """Plain `message` lines on stderr; our loggers at INFO (also when a host already configured logging)."""
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    logger.setLevel(logging.INFO)
