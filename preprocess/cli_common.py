"""What every preprocess-room CLI shares: logging setup (errors and interruptions: `indexed_dataset.cli_support`)."""

from __future__ import annotations

import logging
import sys


logger = logging.getLogger("preprocess")


def setup_logging() -> None:
    """Plain `message` lines on stderr; our loggers at INFO (also when a host already configured logging)."""
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    logger.setLevel(logging.INFO)
