"""`preprocess_data`: JSON lines to Megatron `.bin/.idx`, streaming, in input order.

    from preprocess import PreprocessConfig, preprocess_data
    from preprocess.tokenizers import TokenizerConfig
    summary = preprocess_data(PreprocessConfig(
        input="corpus.jsonl", output_prefix="out/corpus", append_eod=True,
        tokenizer=TokenizerConfig(tokenizer_type="GPT2BPETokenizer", vocab_file="gpt2-vocab.json",
                                  merge_file="gpt2-merges.txt")))
    # -> out/corpus_text_document.bin/.idx, byte-identical to Megatron's tools/preprocess_data.py

The main process reads line-aligned chunks, workers parse and tokenize them (see `workers.py`), and
the main process appends each chunk's documents with one vectorised `add_documents` call per key.
Documents keep their input order whatever the number of workers or partitions. Any error aborts
every writer, so a failed or interrupted run leaves no output that looks complete.
"""

from __future__ import annotations

import collections
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from indexed_dataset import IndexedDatasetWriter, TokenmillError, merge_datasets, optimal_dtype

from .config import PreprocessConfig
from .documents import EncodedChunk, EncodeSettings
from .inputs import JsonLinesChunk, JsonLinesReader, resolve_input_files
from .jsonl import SKIPPED_LINES_QUOTED
from .progress import Progress
from .tokenizers import build_tokenizer
from .workers import chunk_encoder

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PreprocessSummary:
    """What a run wrote.

    Attributes:
        output_prefixes: output dataset prefix per JSON key.
        dtype: token dtype of the outputs.
        documents: input documents (lines) written, per key.
        tokens: tokens written, all keys together.
        num_bytes: JSON bytes read.
        seconds: wall time.
        empty_documents: (document, key) pairs that produced no tokens.
        skipped: (file, line, reason) of the first skipped invalid lines (skip_invalid only).
        skipped_lines: how many lines were skipped.
        skipped_files: empty files skipped.
    """

    output_prefixes: dict[str, str]
    dtype: np.dtype
    documents: int
    tokens: int
    num_bytes: int
    seconds: float
    empty_documents: int
    skipped: list[tuple[str, int, str]]
    skipped_lines: int
    skipped_files: list[str]

    def describe(self) -> str:
        """One line for the log."""
        line = (f"Done: {self.documents} documents, {self.tokens} tokens, {self.num_bytes} bytes in "
                f"{self.seconds:.2f} s ({self.num_bytes / 2**20 / max(self.seconds, 1e-9):.1f} MB/s), "
                f"{self.empty_documents} empty documents, dtype {self.dtype.name} -> "
                f"{', '.join(self.output_prefixes.values())}")
        if self.skipped_lines or self.skipped_files:
            where = ", ".join(f"{source}:{number}" for source, number, _ in self.skipped)
            line += f"; skipped {self.skipped_lines} invalid lines ({where}) and {len(self.skipped_files)} empty files"
        return line


class _Outputs:
    """One writer per key; with several partitions, one partial dataset per partition, merged at the end."""

    def __init__(self, config: PreprocessConfig, dtype: np.dtype) -> None:
        self.config = config
        self.dtype = dtype
        self.partition = -1
        self.writers: dict[str, IndexedDatasetWriter] = {}
        self.partials: dict[str, list[str]] = {key: [] for key in config.json_keys}
        self.scratch = None
        if config.partitions > 1:
            directory = os.path.dirname(os.path.abspath(config.output_prefix))
            self.scratch = tempfile.mkdtemp(prefix=".tokenmill-partitions-", dir=directory)

    def write(self, partition: int, chunk: EncodedChunk) -> None:
        if partition != self.partition:
            self._open(partition)
        for key, column in chunk.columns.items():
            self.writers[key].add_documents(column.tokens, column.sequence_lengths, column.document_sequence_counts)

    def _open(self, partition: int) -> None:
        self._finalize_writers()
        self.partition = partition
        for key in self.config.json_keys:
            final = self.config.output_prefix_of(key)
            prefix = final if self.scratch is None else os.path.join(self.scratch, f"{partition:05d}_{key}")
            self.partials[key].append(prefix)
            self.writers[key] = IndexedDatasetWriter(prefix, self.dtype)

    def _finalize_writers(self) -> None:
        while self.writers:
            self.writers.popitem()[1].finalize()

    def finish(self) -> None:
        if self.partition < 0:  # no documents at all: still write (empty) outputs
            self._open(0)
        self._finalize_writers()
        if self.scratch is not None:
            for key, prefixes in self.partials.items():
                merge_datasets(prefixes, self.config.output_prefix_of(key))
            self._remove_scratch()

    def abort(self) -> None:
        while self.writers:
            self.writers.popitem()[1].abort()
        self._remove_scratch()

    def _remove_scratch(self) -> None:
        if self.scratch is not None:
            shutil.rmtree(self.scratch, ignore_errors=True)
            self.scratch = None


def _partition_of(start: int, partitions: int, total_bytes: int) -> int:
    """The partition of a chunk starting `start` bytes into the input: contiguous, equal byte ranges."""
    return min(partitions - 1, start * partitions // max(total_bytes, 1))


def _recording_starts(reader: JsonLinesReader, starts: collections.deque) -> Iterator[JsonLinesChunk]:
    """The reader's chunks, recording in `starts` the on-disk offset where each began."""
    start = 0
    for chunk in reader:
        starts.append(start)
        start = chunk.disk_offset
        yield chunk


def preprocess_data(config: PreprocessConfig, use_progress_bar: bool | None = None) -> PreprocessSummary:
    """Tokenize JSON lines into one Megatron `.bin/.idx` pair per key.

    Args:
        config: the run.
        use_progress_bar: tqdm bar (default: when stderr is a terminal), else log lines.

    Raises:
        TokenmillError: bad input (`file:line: reason`), a tokenizer that cannot be built, a token id
            that does not fit the dtype, or a dead worker. No output is left behind.
    """
    output_directory = os.path.dirname(os.path.abspath(config.output_prefix))
    if not os.path.isdir(output_directory):
        raise TokenmillError(f"{output_directory}: output directory does not exist")
    tokenizer = build_tokenizer(config.tokenizer)
    settings = EncodeSettings(
        keys=tuple(config.json_keys),
        eod=tokenizer.eod if config.append_eod else None,
        skip_invalid=config.skip_invalid,
        lang=config.lang if config.split_sentences else None,
        keep_newlines=config.keep_newlines,
    )
    dtype = optimal_dtype(tokenizer.vocab_size, config.token_dtype_rule)
    reader = JsonLinesReader(resolve_input_files(config.input), config.chunk_bytes, config.skip_invalid)
    progress = Progress(config.log_interval, reader.total_bytes, use_progress_bar)
    outputs = _Outputs(config, dtype)
    skipped: list[tuple[str, int, str]] = []
    try:
        with chunk_encoder(config.workers, tokenizer, config.tokenizer, settings) as encode_all:
            starts: collections.deque[int] = collections.deque()
            for encoded in encode_all(_recording_starts(reader, starts)):
                outputs.write(_partition_of(starts.popleft(), config.partitions, reader.total_disk_bytes), encoded)
                quoted = [(encoded.source, number, reason) for number, reason in encoded.skipped]
                skipped += quoted[: SKIPPED_LINES_QUOTED - len(skipped)]
                columns = encoded.columns.values()
                progress.update(
                    documents=encoded.num_documents,
                    tokens=sum(len(column.tokens) for column in columns),
                    num_bytes=encoded.num_bytes,
                    empty_documents=sum(column.num_empty_documents for column in columns),
                    skipped_lines=len(encoded.skipped),
                )
        outputs.finish()
    except BaseException:
        outputs.abort()
        raise
    finally:
        progress.close()
    counts = progress.counts
    for source, number, reason in skipped:
        logger.warning("%s:%d: skipped: %s", source, number, reason)
    return PreprocessSummary(
        output_prefixes={key: config.output_prefix_of(key) for key in config.json_keys},
        dtype=dtype,
        documents=counts.documents,
        tokens=counts.tokens,
        num_bytes=counts.num_bytes,
        seconds=progress.seconds,
        empty_documents=counts.empty_documents,
        skipped=skipped,
        skipped_lines=counts.skipped_lines,
        skipped_files=list(reader.empty_files),
    )
