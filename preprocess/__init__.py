"""tokenmill preprocess room: corpora in, Megatron `.bin/.idx` token files out.

    from preprocess import PreprocessConfig, preprocess_data
"""

from .config import PreprocessConfig
from .pipeline import PreprocessSummary, preprocess_data

__all__ = ["PreprocessConfig", "PreprocessSummary", "preprocess_data"]
