"""Token datasets of every format tokenmill writes, as the samplers read them.

    source = TokenSource("data/x_text_document")     # Megatron mmap prefix (or its .bin/.idx path)
    source = TokenSource("out/x_text_document_arrow") # Arrow `save_to_disk` folder (or one .arrow file)
    source = TokenSource("out/x_text_document.mindrecord")   # MindRecord (any shard names the set)
    source.sequence_lengths, source.document_indices  # int32 [S], int64 [D + 1]: all the index math reads
    source.get(5, offset=10, length=20)               # tokens [10, 30) of sequence 5
    source.sequences(3, 7)                            # sequences 3..6, concatenated

The format is detected from the path and the file is opened through the reader protocol
(`indexed_dataset.formats.open_reader`), so the index arrays, and therefore the samples, depend only on
the sequence lengths and tokens: an Arrow or MindRecord copy of a `.bin/.idx` pair gives the same samples
as the pair itself. Index caches stay apart per copy: the cache key covers the size and mtime of the
files the tokens are read from (see `fingerprint`).
"""

from __future__ import annotations

import os

import numpy as np

from indexed_dataset import IndexFormatError
from indexed_dataset.formats import format_of, open_reader
from indexed_dataset.names import ARROW_STATE_FILE


class TokenSource:
    """One dataset of any format, read-only.

    Args:
        path: an mmap prefix (or its `.bin`/`.idx`), an Arrow folder or `.arrow` file, or a `.mindrecord` file.
        mmap_bin: mmap format: map the `.bin` (False: plain file reads, Megatron's --no-mmap-bin-files).

    Attributes:
        prefix: the dataset's path as given (mmap: the prefix without `.bin`/`.idx`); names cache files.
        format: "mmap", "arrow" or "mindrecord".
        sequence_lengths: int32 [S] tokens per sequence.
        document_indices: int64 [D + 1] first sequence of each document.

    Raises:
        IndexFormatError, ShardFormatError: the files are missing or damaged (one line naming the file).
    """

    def __init__(self, path: str, mmap_bin: bool = True) -> None:
        self.format = format_of(str(path))
        self.reader = open_reader(str(path), self.format, mmap_bin=mmap_bin)
        # IndexedDataset strips `.bin`/`.idx`; a folder loses a trailing "/" (its basename names cache files).
        self.prefix = self.reader.prefix if self.format == "mmap" else os.path.normpath(str(path))
        self.sequence_lengths = self.reader.sequence_lengths
        self.document_indices = self.reader.document_indices
        self.dtype = np.dtype(self.reader.dtype)

    def __len__(self) -> int:
        return len(self.sequence_lengths)

    @property
    def num_documents(self) -> int:
        return len(self.document_indices) - 1

    def files(self) -> list[str]:
        """Absolute paths of the files the lengths and tokens are read from."""
        if self.format == "mmap":
            return [os.path.abspath(self.reader.bin_path), os.path.abspath(self.reader.idx_path)]
        paths = [os.path.abspath(p) for p in self.reader.paths]
        if self.format == "arrow" and os.path.isdir(self.prefix):
            # The state file lists (and orders) the shards: replacing it changes the dataset.
            paths.append(os.path.abspath(os.path.join(self.prefix, ARROW_STATE_FILE)))
        return paths

    def fingerprint(self) -> dict[str, object]:
        """Path, and size and mtime of every file: a changed or replaced dataset gets new cache keys.

        For mmap this is the original key (absolute prefix, `.bin` and `.idx` size and mtime), so caches
        built before other formats were accepted stay valid.
        """
        if self.format == "mmap":
            fingerprint: dict[str, object] = {"prefix": os.path.abspath(self.prefix)}
            for kind, path in zip(("bin", "idx"), self.files()):
                stat = os.stat(path)
                fingerprint[f"{kind}_size"] = stat.st_size
                fingerprint[f"{kind}_mtime_ns"] = stat.st_mtime_ns
            return fingerprint
        files = {}
        for path in self.files():
            stat = os.stat(path)
            files[path] = {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
        return {"path": os.path.abspath(self.prefix), "format": self.format, "files": files}

    def get(self, index: int, offset: int = 0, length: int | None = None) -> np.ndarray:
        """Tokens `[offset, offset + length)` of sequence `index` (to its end when length is None).

        Raises:
            IndexError: the sequence or the token range is out of bounds.
        """
        if self.format == "mmap":
            return self.reader.get(index, offset=offset, length=length)
        sequence = self.reader[index]
        end = len(sequence) if length is None else offset + length
        if offset < 0 or end < offset or end > len(sequence):
            raise IndexError(f"{self.prefix}: tokens [{offset}, {end}) outside sequence {index} "
                             f"of length {len(sequence)}")
        return sequence[offset:end]

    def sequences(self, first: int, last: int) -> np.ndarray:
        """Tokens of sequences `[first, last)`, concatenated (a view for mmap, a copy otherwise)."""
        if self.format == "mmap":
            start = int(self.reader.sequence_pointers[first]) // self.dtype.itemsize
            count = int(self.sequence_lengths[first:last].sum(dtype=np.int64))
            tokens = self.reader.tokens[start : start + count]
            if len(tokens) != count:
                raise IndexFormatError(f"{self.reader.idx_path}: sequence {first} points past the end of "
                                       f"{self.reader.bin_path}; run inspect-index --validate")
            return tokens
        parts = self.reader[first:last]
        return np.concatenate([np.zeros(0, self.dtype), *parts]) if len(parts) != 1 else parts[0]

    def __getstate__(self) -> dict:
        # Readers hold memory maps, which cannot be pickled: a copy reopens the files by path.
        return {"path": self.prefix}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["path"])

    def __repr__(self) -> str:
        return f"TokenSource({self.prefix!r}, format={self.format}, sequences={len(self)})"
