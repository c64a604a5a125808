"""What every input chunk kind parses into (`ParsedChunk`: text columns and kept fields), shared by the
JSON-lines parser (`jsonl`), the columnar readers (`columnar`) and the document encoder (`documents`)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa


@dataclass(frozen=True)
class TextColumn:
    """One key's texts for a run of documents.

    Attributes:
        pieces: the texts; a document's string is one piece, a list of strings is one piece each.
        piece_counts: int64 [D] pieces per document, or None when every document has exactly one.
    """

    pieces: pa.LargeStringArray
    piece_counts: np.ndarray | None = None


@dataclass
class ParsedChunk:
    """The documents of one chunk.

    Attributes:
        source: the input file.
        line_numbers: int64 [D], 1-based line (0-based row for columnar inputs) of each document.
        columns: one TextColumn per JSON key.
        skipped: (line, reason) of the invalid lines skipped (only when skipping is on).
        fields: kept scalar fields, name -> [D] values (int64, double or string; see `field_array`).
    """

    source: str
    line_numbers: np.ndarray
    columns: dict[str, TextColumn]
    skipped: list[tuple[int, str]] = field(default_factory=list)
    fields: dict[str, pa.Array] = field(default_factory=dict)

    @property
    def num_documents(self) -> int:
        return len(self.line_numbers)


def field_array(values: pa.Array, name: str) -> pa.Array:
    """A kept field's values as int64, double or string (the types the Arrow writer stores).

    Raises:
        ValueError: the values are not all numbers or all strings (booleans, objects, arrays...).
    """
    kind = values.type
    if pa.types.is_integer(kind):
        return values.cast(pa.int64())
    if pa.types.is_floating(kind):
        return values.cast(pa.float64())
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return values.cast(pa.string())
    if pa.types.is_null(kind):
        return values
    raise ValueError(f"field {name!r} holds {kind} values, expected numbers or strings")
