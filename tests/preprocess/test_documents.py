"""Documents are assembled from tokenized pieces exactly as Megatron's per-document loop does."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from preprocess.documents import assemble_documents, split_column
from preprocess.chunks import TextColumn
from preprocess.sentences import SentenceSplitter

EOD = 99


def megatron_documents(pieces_per_document: list[list[list[int]]], eod: int | None):
    """Reference twin: Megatron's Encoder.encode + builder.add_document, one document at a time."""
    tokens, lengths, counts = [], [], []
    for pieces in pieces_per_document:
        ids, sentence_lengths = [], []
        for piece in pieces:
            if piece:
                ids.extend(piece)
                sentence_lengths.append(len(piece))
        if eod is not None and ids:
            ids.append(eod)
            sentence_lengths[-1] += 1
        tokens.extend(ids)
        lengths.extend(sentence_lengths)
        counts.append(len(sentence_lengths))
    return tokens, lengths, counts


documents_strategy = st.lists(st.lists(st.lists(st.integers(0, 50), max_size=4), max_size=4), max_size=12)


@settings(max_examples=200, deadline=None)
@given(documents=documents_strategy, eod=st.sampled_from([None, EOD]), one_piece=st.booleans())
def test_assemble_documents_equals_the_per_document_loop(documents, eod, one_piece):
    if one_piece:
        documents = [document[:1] or [[]] for document in documents]
    pieces = [piece for document in documents for piece in document]
    flat = np.array([token for piece in pieces for token in piece], dtype=np.uint32)
    piece_lengths = np.array([len(piece) for piece in pieces], dtype=np.int64)
    counts = None if one_piece else np.array([len(document) for document in documents], dtype=np.int64)
    got = assemble_documents(flat, piece_lengths, counts, eod)
    tokens, lengths, sequence_counts = megatron_documents(documents, eod)
    assert got.tokens.tolist() == tokens
    assert got.sequence_lengths.tolist() == lengths
    assert got.document_sequence_counts.tolist() == sequence_counts
    assert got.tokens.dtype == np.uint32


def test_split_column_splits_every_piece_and_counts_per_document():
    column = TextColumn(pa.array(["One. Two.", "Three. Four. Five.", "Six"], type=pa.large_string()),
                        np.array([2, 0, 1], dtype=np.int64))
    split = split_column(column, SentenceSplitter())
    assert split.pieces.to_pylist() == ["One.", "Two.", "Three.", "Four.", "Five.", "Six"]
    assert split.piece_counts.tolist() == [5, 0, 1]
