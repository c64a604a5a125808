"""Progress of a preprocessing run: a tqdm bar on a terminal, plain log lines otherwise."""

from __future__ import annotations

import logging
import sys
import time
from dataclasses import dataclass

logger = logging.getLogger(__name__)

MEGABYTE = 2**20


@dataclass
class Counts:
    """Running totals of a run."""

    documents: int = 0
    tokens: int = 0
    num_bytes: int = 0
    empty_documents: int = 0
    skipped_lines: int = 0

    def rates(self, seconds: float) -> str:
        seconds = max(seconds, 1e-9)
        return (f"{self.documents / seconds:,.0f} docs/s, {self.num_bytes / MEGABYTE / seconds:,.1f} MB/s, "
                f"{self.tokens / seconds:,.0f} tokens/s")


class Progress:
    """Reports counts as they grow.

    Args:
        log_interval: with no terminal, log a line each time this many more documents are done.
        total_bytes: input size for the bar (None: unknown).
        use_bar: show a tqdm bar (default: when stderr is a terminal).
    """

    def __init__(self, log_interval: int, total_bytes: int | None = None, use_bar: bool | None = None) -> None:
        self.counts = Counts()
        self.log_interval = log_interval
        self.started = time.perf_counter()
        self._next_log = log_interval
        self._bar = None
        if use_bar if use_bar is not None else sys.stderr.isatty():
            from tqdm import tqdm

            self._bar = tqdm(total=total_bytes, unit="B", unit_scale=True, unit_divisor=1024, file=sys.stderr)

    @property
    def seconds(self) -> float:
        return time.perf_counter() - self.started

    def update(self, documents: int, tokens: int, num_bytes: int, empty_documents: int, skipped_lines: int) -> None:
        counts = self.counts
        counts.documents += documents
        counts.tokens += tokens
        counts.num_bytes += num_bytes
        counts.empty_documents += empty_documents
        counts.skipped_lines += skipped_lines
        if self._bar is not None:
            self._bar.update(num_bytes)
            self._bar.set_postfix_str(counts.rates(self.seconds), refresh=False)
        elif counts.documents >= self._next_log:
            logger.info("Processed %d documents (%s)", counts.documents, counts.rates(self.seconds))
            self._next_log = (counts.documents // self.log_interval + 1) * self.log_interval

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
