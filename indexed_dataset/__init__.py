"""On-disk token formats: Megatron's mmap `.bin/.idx` (reader, streaming writer, merge), Hugging Face
Arrow shards and MindRecord (through `open_writer` / `open_reader`, loaded on first use), conversion."""

from .convert import convert
from .errors import IndexFormatError, ShardFormatError, TokenmillError, TokenRangeError
from .format import DType, data_file_path, index_file_path, optimal_dtype
from .formats import FORMATS, format_of, open_reader, open_writer
from .merge import datasets_in_directory, merge_datasets
from .reader import IndexedDataset
from .writer import IndexedDatasetWriter

__all__ = [
    "FORMATS",
    "DType",
    "IndexFormatError",
    "IndexedDataset",
    "IndexedDatasetWriter",
    "ShardFormatError",
    "TokenRangeError",
    "TokenmillError",
    "convert",
    "data_file_path",
    "datasets_in_directory",
    "format_of",
    "index_file_path",
    "merge_datasets",
    "open_reader",
    "open_writer",
    "optimal_dtype",
]
