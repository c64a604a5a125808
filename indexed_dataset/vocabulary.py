"""Token ids against a tokenizer's vocabulary: an id outside [0, vocab_size) (a flipped bit in a file without
checksums, a dataset made with another tokenizer) is one error naming the file and the document, found with
one min and one max per batch of documents (the document is located only when there is one).

    check_vocabulary(reader.read_documents(0, 8192), 50257, "data/corpus_arrow", first_document=0)
"""

from __future__ import annotations

import numpy as np

from .errors import TokenRangeError
from .protocol import DocumentBatch


def check_token_ids(tokens: np.ndarray, document_offsets: np.ndarray, vocab_size: int, source: str,
                    first_document: int = 0) -> None:
    """Check that every id of a batch of documents lies in [0, vocab_size).

    Args:
        tokens: [N] ids of the batch's documents, concatenated (any integer dtype).
        document_offsets: int64 [D+1], where each document starts in `tokens` (last entry N).
        vocab_size: the tokenizer's vocabulary size.
        source: the dataset's path, for the message.
        first_document: the dataset's index of the batch's first document.

    Raises:
        TokenRangeError: naming `source`, the document's index and the id.
    """
    if not len(tokens) or (int(tokens.min()) >= 0 and int(tokens.max()) < vocab_size):
        return
    position = int(np.flatnonzero((tokens < 0) | (tokens >= vocab_size))[0])
    document = first_document + int(np.searchsorted(document_offsets, position, side="right")) - 1
    raise TokenRangeError(f"{source}: document {document}: token id {int(tokens[position])} is outside the "
                          f"vocabulary of {vocab_size} ids (damaged, or made with another tokenizer)")


def check_vocabulary(batch: DocumentBatch, vocab_size: int, source: str, first_document: int = 0) -> None:
    """`check_token_ids` of a `DocumentBatch` read from `source` starting at document `first_document`."""
    check_token_ids(batch.tokens, batch.document_token_offsets(), vocab_size, source, first_document)
