"""tokenmill preprocess room: corpora in (JSON lines, Parquet, Arrow, `datasets`), Megatron `.bin/.idx`
(and Arrow, MindRecord) token files out; `inspect-index` and `merge-datasets` around them.

    from preprocess import PreprocessConfig, preprocess_data
"""

from .config import PreprocessConfig
from .pipeline import PreprocessSummary, preprocess_data

__all__ = ["PreprocessConfig", "PreprocessSummary", "preprocess_data"]
