"""On-disk token formats: Megatron's mmap `.bin/.idx` (reader, streaming writer, merge)."""

from .errors import IndexFormatError, TokenmillError, TokenRangeError
from .format import DType, data_file_path, index_file_path, optimal_dtype
from .merge import merge_datasets, prefixes_in_directory
from .reader import IndexedDataset
from .writer import IndexedDatasetWriter

__all__ = [
    "DType",
    "IndexFormatError",
    "IndexedDataset",
    "IndexedDatasetWriter",
    "TokenRangeError",
    "TokenmillError",
    "data_file_path",
    "index_file_path",
    "merge_datasets",
    "optimal_dtype",
    "prefixes_in_directory",
]
