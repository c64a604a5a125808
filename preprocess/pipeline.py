"""`preprocess_data`: documents to Megatron `.bin/.idx` (and Arrow, MindRecord), streaming, in input order.

    from preprocess import PreprocessConfig, preprocess_data
    from preprocess.tokenizers import TokenizerConfig
    summary = preprocess_data(PreprocessConfig(
        input="corpus.jsonl", output_prefix="out/corpus", append_eod=True,
        tokenizer=TokenizerConfig(tokenizer_type="GPT2BPETokenizer", vocab_file="gpt2-vocab.json",
                                  merge_file="gpt2-merges.txt")))
    # -> out/corpus_text_document.bin/.idx, byte-identical to Megatron's tools/preprocess_data.py

The main process reads chunks (line-aligned JSON, or record batches of columnar files: see
`inputs.py`), workers parse and tokenize them (see `workers.py`), and the main process appends each
chunk's documents with one vectorised `add_documents` call per key and output format (`outputs.py`).
Documents keep their input order whatever the number of workers or partitions. Outputs are written
in a staging directory and published together, between removing and writing the run's done marker
(`outputs.py`, `fanout.py`); any error or interruption aborts every writer, so a failed or
interrupted run leaves no output that looks complete, and rerunning the same command skips a finished
run or redoes an unfinished one. With `world_size > 1` this process makes only its part of the job.
"""

from __future__ import annotations

import collections
import logging
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np

from indexed_dataset import TokenmillError, optimal_dtype

from .columnar import hf_dataset_chunks
from .config import PreprocessConfig
from .documents import EncodeSettings
from .fanout import clear_part, mark_done, part_fingerprint, part_is_done, rank_files, remove_marker
from .inputs import InputReader, resolve_inputs
from .jsonl import SKIPPED_LINES_QUOTED
from .outputs import Outputs, check_outputs, written_names
from .progress import Progress
from .tokenizers import build_tokenizer
from .workers import chunk_encoder, usable_workers

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PreprocessSummary:
    """What a run wrote.

    Attributes:
        output_prefixes: mmap output dataset prefix per JSON key.
        output_paths: per JSON key, format -> the output as written (`x.mindrecord0..3` for shards).
        dtype: token dtype of the outputs.
        documents: input documents (lines) written, per key.
        tokens: tokens written, all keys together.
        num_bytes: JSON bytes read.
        seconds: wall time.
        empty_documents: (document, key) pairs that produced no tokens.
        skipped: (file, line, reason) of the first skipped invalid lines (skip_invalid only).
        skipped_lines: how many lines were skipped.
        skipped_files: empty files skipped.
        input_files: the files this process read (its block of them when fanned out).
        already_done: the part was marked done by an earlier run of the same command; nothing was redone.
    """

    output_prefixes: dict[str, str]
    output_paths: dict[str, dict[str, str]]
    dtype: np.dtype
    documents: int
    tokens: int
    num_bytes: int
    seconds: float
    empty_documents: int
    skipped: list[tuple[str, int, str]]
    skipped_lines: int
    skipped_files: list[str]
    input_files: list[str]
    already_done: bool = False

    def describe(self) -> str:
        """One line for the log."""
        if self.already_done:
            return (f"Already done (marker found): {', '.join(self.output_prefixes.values())}; nothing redone "
                    "(--overwrite redoes it)")
        outputs = ", ".join(path for paths in self.output_paths.values() for path in paths.values())
        line = (f"Done: {self.documents} documents, {self.tokens} tokens, {self.num_bytes} bytes in "
                f"{self.seconds:.2f} s ({self.num_bytes / 2**20 / max(self.seconds, 1e-9):.1f} MB/s), "
                f"{self.empty_documents} empty documents, dtype {self.dtype.name} -> {outputs}")
        if self.skipped_lines or self.skipped_files:
            where = ", ".join(f"{source}:{number}" for source, number, _ in self.skipped)
            line += f"; skipped {self.skipped_lines} invalid lines ({where}) and {len(self.skipped_files)} empty files"
        return line


def _partition_of(start: int, partitions: int, total_bytes: int) -> int:
    """The partition of a chunk starting `start` bytes into the input: contiguous, equal byte ranges."""
    return min(partitions - 1, start * partitions // max(total_bytes, 1))


def _recording_starts(reader: Iterable, starts: collections.deque) -> Iterator:
    """The reader's chunks, recording in `starts` the on-disk offset where each began."""
    start = 0
    for chunk in reader:
        starts.append(start)
        start = chunk.disk_offset
        yield chunk


def preprocess_data(config: PreprocessConfig, use_progress_bar: bool | None = None) -> PreprocessSummary:
    """Tokenize documents into one dataset per JSON key and output format.

    Args:
        config: the run.
        use_progress_bar: tqdm bar (default: when stderr is a terminal), else log lines.

    Raises:
        TokenmillError: bad input (`file:line: reason`), a tokenizer that cannot be built, a token id
            that does not fit the dtype, a dead worker, (fanned out) a part marked done by another
            command, or an output that would overwrite an input or something not ours (`check_outputs`).
            No output is left behind, and nothing that was there is removed.
    """
    output_directory = os.path.dirname(os.path.abspath(config.output_prefix))
    if not os.path.isdir(output_directory):
        raise TokenmillError(f"{output_directory}: output directory does not exist")
    paths = resolve_inputs(config.input) if config.input else []
    if config.world_size > 1:
        paths = rank_files(paths, config.rank, config.world_size)
    check_outputs(config, paths)
    fingerprint = part_fingerprint(config, paths)
    # A streamed --hf-dataset has no files to fingerprint: its run is always redone.
    if config.hf_dataset is None and part_is_done(config, fingerprint):
        return _already_done(config, paths)
    clear_part(config)
    if config.world_size > 1:
        logger.info("rank %d of %d: %d input files -> %s", config.rank, config.world_size, len(paths),
                    config.part_prefix)
    return _run(config, paths, use_progress_bar, fingerprint)


def _already_done(config: PreprocessConfig, paths: list[str]) -> PreprocessSummary:
    tokenizer = build_tokenizer(config.tokenizer)
    return PreprocessSummary(
        output_prefixes={key: config.output_prefix_of(key) for key in config.json_keys},
        output_paths=written_names(config),
        dtype=optimal_dtype(tokenizer.vocab_size, config.token_dtype_rule),
        documents=0, tokens=0, num_bytes=0, seconds=0.0, empty_documents=0, skipped=[], skipped_lines=0,
        skipped_files=[], input_files=paths, already_done=True,
    )


def _run(
    config: PreprocessConfig, paths: list[str], use_progress_bar: bool | None, fingerprint: str
) -> PreprocessSummary:
    tokenizer = build_tokenizer(config.tokenizer)
    settings = EncodeSettings(
        keys=tuple(config.json_keys),
        eod=tokenizer.eod if config.append_eod else None,
        skip_invalid=config.skip_invalid,
        lang=config.lang if config.split_sentences else None,
        keep_newlines=config.keep_newlines,
        fields=tuple(config.keep_fields),
    )
    dtype = optimal_dtype(tokenizer.vocab_size, config.token_dtype_rule)
    columns = [*config.json_keys, *config.keep_fields]
    if config.hf_dataset is not None:
        reader = hf_dataset_chunks(config.hf_dataset, config.hf_split, config.hf_data_files, columns,
                                   config.chunk_bytes)
        total_bytes, total_disk_bytes, empty_files = None, 0, []
    else:
        reader = InputReader(paths, config.chunk_bytes, config.skip_invalid, columns, config.max_line_mb)
        total_bytes, total_disk_bytes, empty_files = reader.total_bytes, reader.total_disk_bytes, reader.empty_files
    progress = Progress(config.log_interval, total_bytes, use_progress_bar)
    skipped: list[tuple[str, int, str]] = []
    try:
        outputs = Outputs(config, dtype)
        try:
            workers = usable_workers(config.workers, config.encoder_memory_limit_mb)
            with chunk_encoder(workers, tokenizer, config.tokenizer, settings,
                               config.encoder_memory_limit_mb) as encode_all:
                del tokenizer  # the encoder owns it now: it frees it once its encoder processes take over
                starts: collections.deque[int] = collections.deque()
                for encoded in encode_all(_recording_starts(reader, starts)):
                    outputs.write(_partition_of(starts.popleft(), config.partitions, total_disk_bytes), encoded)
                    quoted = [(encoded.source, number, reason) for number, reason in encoded.skipped]
                    skipped += quoted[: SKIPPED_LINES_QUOTED - len(skipped)]
                    encoded_columns = encoded.columns.values()
                    progress.update(
                        documents=encoded.num_documents,
                        tokens=sum(len(column.tokens) for column in encoded_columns),
                        num_bytes=encoded.num_bytes,
                        empty_documents=sum(column.num_empty_documents for column in encoded_columns),
                        skipped_lines=len(encoded.skipped),
                    )
            outputs.finalize()
            remove_marker(config)
            outputs.publish()
            mark_done(config, fingerprint)
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
        output_paths=written_names(config),
        dtype=dtype,
        documents=counts.documents,
        tokens=counts.tokens,
        num_bytes=counts.num_bytes,
        seconds=progress.seconds,
        empty_documents=counts.empty_documents,
        skipped=skipped,
        skipped_lines=counts.skipped_lines,
        skipped_files=list(empty_files),
        input_files=paths,
    )
