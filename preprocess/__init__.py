"""tokenmill preprocess room: corpora in (JSON lines, Parquet, Arrow, `datasets`), Megatron `.bin/.idx`
(and Arrow, MindRecord) token files out; `inspect-index` and `merge-datasets` around them.

    from preprocess import PreprocessConfig, preprocess_data
"""

from __future__ import annotations

import importlib

# Imported on first use (PEP 562): encoder processes import `preprocess.workers`, and must not pay
# for the writers' imports (numba: ~56 MB and ~0.3 s per process, issue 19).
_EXPORTS = {"PreprocessConfig": ".config", "PreprocessSummary": ".pipeline", "preprocess_data": ".pipeline"}

__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name], __name__), name)
