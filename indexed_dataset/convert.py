"""Convert a token dataset between the mmap (`.bin/.idx`), Arrow and MindRecord formats.

    from indexed_dataset.convert import convert
    convert("data/corpus_text_document", "out/corpus_arrow", target_format="arrow")
    convert("out/corpus_arrow", "out/corpus.mindrecord", target_format="mindrecord", num_shards=4)

Documents stream through in batches, so memory stays bounded by one batch plus what the target
writer keeps per document. Tokens and document (and sequence) boundaries round-trip exactly; a
multi-shard MindRecord is read back shard by shard, which keeps the order when it was written in
one batch per shard (`convert` writes in batches, so use one shard where the order matters).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np

from .formats import FORMATS, has_one_sequence_per_document, open_reader, open_writer

logger = logging.getLogger(__name__)

# Documents per batch: large enough for vectorised encoding, small enough to bound memory.
DEFAULT_BATCH_DOCUMENTS = 8192


def convert(
    input_path: str,
    output_path: str,
    target_format: str,
    source_format: str | None = None,
    dtype: np.dtype | type | str | None = None,
    batch_documents: int = DEFAULT_BATCH_DOCUMENTS,
    **writer_options: Any,
) -> None:
    """Copy every document of `input_path` into a new dataset at `output_path`.

    Args:
        input_path: the source dataset (a mmap prefix, an Arrow directory or `.arrow` file, a
            `.mindrecord` file).
        output_path: the target (a prefix for mmap, a directory for Arrow, a file name for MindRecord).
        target_format: one of `formats.FORMATS`.
        source_format: one of `formats.FORMATS`, or None to detect it from `input_path`.
        dtype: token dtype of the target; None keeps the source's (MindRecord stores int32 or int64).
        batch_documents: documents per read/write batch.
        writer_options: passed to the target writer (see `formats.open_writer`); for Arrow and
            MindRecord `store_sequence_lengths` defaults to whether the source needs it.

    Raises:
        TokenmillError: unreadable source, existing target, or ids that do not fit `dtype`.
    """
    if target_format not in FORMATS:
        raise ValueError(f"unknown target format {target_format!r}; expected one of {', '.join(FORMATS)}")
    if batch_documents <= 0:
        raise ValueError(f"batch_documents must be positive, got {batch_documents}")
    started = time.perf_counter()
    reader = open_reader(input_path, source_format)
    target_dtype = np.dtype(dtype) if dtype is not None else reader.dtype
    if target_format != "mmap":
        needs_lengths = not has_one_sequence_per_document(reader.sequence_lengths, np.diff(reader.document_indices))
        writer_options.setdefault("store_sequence_lengths", needs_lengths)
    dropped = getattr(reader, "field_names", [])
    if dropped:
        logger.warning("%s: pass-through fields %s are not converted", input_path, ", ".join(dropped))
    num_documents = len(reader.document_indices) - 1
    with open_writer(target_format, output_path, target_dtype, **writer_options) as writer:
        for first in range(0, num_documents, batch_documents):
            batch = reader.read_documents(first, min(first + batch_documents, num_documents))
            writer.add_documents(batch.tokens, batch.sequence_lengths, batch.document_sequence_counts)
    logger.info(
        "converted %d documents (%d tokens) from %s to %s %s in %.1f s",
        num_documents, reader.num_tokens, input_path, target_format, output_path, time.perf_counter() - started,
    )
