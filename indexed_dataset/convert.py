"""Convert token datasets between the mmap (`.bin/.idx`), Arrow and MindRecord formats, or join several.

    from indexed_dataset.convert import convert
    convert("data/corpus_text_document", "out/corpus_arrow", target_format="arrow")
    convert("out/corpus_arrow", "out/corpus.mindrecord", target_format="mindrecord", num_shards=4)
    convert(["parts/c_part0-of-2_text_document_arrow", "parts/c_part1-of-2_text_document_arrow"],
            "out/c_text_document_arrow", target_format="arrow")          # parts joined in order

Documents stream through in batches, so memory stays bounded by one batch plus what the target
writer keeps per document. Tokens and document (and sequence) boundaries round-trip exactly, and so do
the pass-through fields of Arrow sources written to Arrow; a target writer batches rows by document
count alone, so joining parts gives the bytes of writing their documents in one run. A multi-shard
MindRecord reads back in document order (tokenmill writes it as one `write_raw_data` call; one that
MindSpore wrote in several calls is refused, see `mindrecord_reader`).

Without an explicit dtype, an mmap target gets Megatron's token dtype for the data (`optimal_dtype`
with the rule "megatron", applied to the largest id + 1: uint16 below 65,500 ids, else int32), as
preprocess-data would have chosen it; other targets keep the sources' dtype.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from .checksums import remove_dataset_checksums, verify_dataset_checksums, write_dataset_checksums
from .cli_support import signals_deferred
from .errors import TokenmillError
from .format import optimal_dtype
from .formats import FORMATS, check_replaceable, dataset_files, files_read, format_of, open_reader, open_writer
from .names import mindrecord_files_name
from .path_rules import refuse_output_over_inputs
from .protocol import has_one_sequence_per_document
from .vocabulary import check_vocabulary

logger = logging.getLogger(__name__)

# Documents per batch: large enough for vectorised encoding, small enough to bound memory.
DEFAULT_BATCH_DOCUMENTS = 8192


def convert(
    input_path: str | Sequence[str],
    output_path: str,
    target_format: str,
    source_format: str | None = None,
    dtype: np.dtype | type | str | None = None,
    batch_documents: int = DEFAULT_BATCH_DOCUMENTS,
    vocab_size: int | None = None,
    verify: bool = True,
    **writer_options: Any,
) -> None:
    """Copy every document of `input_path` (or of several datasets, in order) into a new dataset, and write
    the new dataset's checksum manifest beside it (`checksums`).

    Args:
        input_path: the source dataset (a mmap prefix, an Arrow directory or `.arrow` file, a
            `.mindrecord` file), or several, concatenated in the order given.
        output_path: the target (a prefix for mmap, a directory for Arrow, a file name for MindRecord).
        target_format: one of `formats.FORMATS`.
        source_format: one of `formats.FORMATS`, or None to detect it from each input path.
        dtype: token dtype of the target; None picks Megatron's for the ids of the data when the target
            is mmap (see the module docstring), else keeps the sources' (which must then agree;
            MindRecord stores int32 or int64).
        batch_documents: documents per read/write batch.
        vocab_size: every id must lie in [0, vocab_size) (the tokenizer's vocabulary); None: not checked.
        verify: check each source against its checksum manifest, when it has one, before reading it.
        writer_options: passed to the target writer (see `formats.open_writer`); for Arrow and
            MindRecord `store_sequence_lengths` defaults to whether a source needs it.

    Raises:
        TokenmillError: no, unreadable or damaged sources, sources of different dtypes (all checked
            before writing), an existing target, a target that would overwrite a source (however
            spelled) or that is not a file or folder of ours (a directory, link or FIFO at its name),
            or ids that do not fit `dtype`, or lie outside the vocabulary, or a source that differs from
            its checksum manifest; nothing is left behind.
    """
    if target_format not in FORMATS:
        raise ValueError(f"unknown target format {target_format!r}; expected one of {', '.join(FORMATS)}")
    if batch_documents <= 0:
        raise ValueError(f"batch_documents must be positive, got {batch_documents}")
    paths = [input_path] if isinstance(input_path, str) else list(input_path)
    if not paths:
        raise TokenmillError("nothing to convert: no input dataset")
    if not output_path:
        raise ValueError("the output path is empty")
    started = time.perf_counter()
    readers = [open_reader(path, source_format) for path in paths]
    num_shards = writer_options.get("num_shards", 1)
    inputs = [file for path, reader in zip(paths, readers)
              for file in files_read(source_format or format_of(path), reader)]
    refuse_output_over_inputs(dataset_files(target_format, output_path, num_shards), inputs)
    check_replaceable(target_format, output_path, num_shards)
    # Every source is checked whole before the first byte is written: a damaged input must stop the
    # run, never be passed on (its checksums when it has a manifest: a flipped bit in an Arrow buffer or a
    # MindRecord blob is otherwise a valid, different id; mmap: every array and the file sizes; rows:
    # every row decoded once).
    if verify:
        for path, reader in zip(paths, readers):
            fmt = source_format or format_of(path)
            verify_dataset_checksums(fmt, path, files_read(fmt, reader))
    for reader in readers:
        reader.validate()
    if dtype is None:
        for path, reader in zip(paths[1:], readers[1:]):
            if reader.dtype != readers[0].dtype:
                raise TokenmillError(f"{path}: dtype {reader.dtype.name} differs from {paths[0]}'s "
                                     f"{readers[0].dtype.name}")
    if dtype is not None:
        target_dtype = np.dtype(dtype)
    elif target_format == "mmap":
        target_dtype = megatron_dtype_of(readers, batch_documents)
    else:
        target_dtype = readers[0].dtype
    if target_format != "mmap":
        needs_lengths = any(not has_one_sequence_per_document(r.sequence_lengths, np.diff(r.document_indices))
                            for r in readers)
        writer_options.setdefault("store_sequence_lengths", needs_lengths)
    fields = _passed_fields(paths, readers, target_format)
    num_documents = num_tokens = 0
    remove_dataset_checksums(output_path)
    with contextlib.ExitStack() as stack:
        # Ctrl-C / SIGTERM must not fall between the writer creating its temporaries and the `with`
        # that aborts it (they would stay behind): held until the writer is registered.
        with signals_deferred():
            writer = stack.enter_context(open_writer(target_format, output_path, target_dtype, **writer_options))
        for path, reader in zip(paths, readers):
            count = reader.num_documents
            for first in range(0, count, batch_documents):
                last = min(first + batch_documents, count)
                batch = reader.read_documents(first, last)
                if vocab_size is not None:
                    check_vocabulary(batch, vocab_size, path, first)
                extra = {"fields": {name: reader.field_values(name, first, last) for name in fields}} if fields else {}
                writer.add_documents(batch.tokens, batch.sequence_lengths, batch.document_sequence_counts, **extra)
            num_documents += count
            num_tokens += reader.num_tokens
    write_dataset_checksums(output_path, dataset_files(target_format, output_path, num_shards))
    written = output_path
    if target_format == "mindrecord":
        written = mindrecord_files_name(output_path, num_shards)
    logger.info("converted %d documents (%d tokens) from %s to %s %s (%s) in %.1f s", num_documents, num_tokens,
                paths[0] if len(paths) == 1 else f"{len(paths)} datasets", target_format, written,
                target_dtype.name, time.perf_counter() - started)


def megatron_dtype_of(readers: Sequence[Any], batch_documents: int) -> np.dtype:
    """Megatron's token dtype for the ids the sources hold (`optimal_dtype(largest id + 1, "megatron")`),
    reading every document once in batches of `batch_documents`.

    Ids Megatron's rule cannot hold (negative, or beyond int32) keep the sources' dtype; with no tokens
    at all, uint16 (Megatron's choice for any small vocabulary).
    """
    smallest, largest = 0, 0
    for reader in readers:
        for first in range(0, reader.num_documents, batch_documents):
            tokens = reader.read_documents(first, min(first + batch_documents, reader.num_documents)).tokens
            if len(tokens):
                smallest, largest = min(smallest, int(tokens.min())), max(largest, int(tokens.max()))
    chosen = optimal_dtype(largest + 1, "megatron")
    if smallest < 0 or largest > np.iinfo(chosen).max:
        return np.result_type(*(reader.dtype for reader in readers))
    return chosen


def _passed_fields(paths: list[str], readers: list[Any], target_format: str) -> list[str]:
    """The pass-through fields to copy: those of Arrow sources going to Arrow (the same in every
    source); others are dropped with a warning."""
    names = [list(getattr(reader, "field_names", [])) for reader in readers]
    if target_format == "arrow" and all(n == names[0] for n in names):
        return names[0]
    for path, dropped in zip(paths, names):
        if dropped:
            logger.warning("%s: pass-through fields %s are not converted", path, ", ".join(dropped))
    return []
