"""Index math, GPT, T5 and blended datasets, the index cache and data-parallel samplers.

    from samplers import GPTDatasetConfig, build_gpt_datasets, DataParallelSampler
    cfg = GPTDatasetConfig(sequence_length=128, blend=(["data/x_text_document"], None), split="949,50,1")
    train, valid, test = build_gpt_datasets(cfg, sizes=(1000, 100, None))
    from samplers import T5DatasetConfig, build_t5_datasets   # T5 span corruption on sentence-split data

Every name is imported on first use: the index builders (`samplers.builder`, `samplers.indices`, the
`build-indices` CLI) run without paying for importing torch, and `samplers.splits` (the split default)
without compiling the numba kernels.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    # Even the torch-free names load on first use: `import samplers.splits` (the split default,
    # wanted by `inspect-index`) must not pay for compiling the numba kernels.
    "GPTDatasetConfig": "samplers.config",
    "DataParallelSampler": "samplers.sampler",
    "build_gpt_datasets": "samplers.datasets",
    "GPTDataset": "samplers.gpt.dataset",
    "BlendedDataset": "samplers.blended_dataset",
    "T5DatasetConfig": "samplers.t5.dataset",
    "T5Dataset": "samplers.t5.dataset",
    "build_t5_datasets": "samplers.t5.dataset",
    "inspect_t5_splits": "samplers.t5.dataset",
}

__all__ = ["BlendedDataset", "DataParallelSampler", "GPTDataset", "GPTDatasetConfig", "T5Dataset", "T5DatasetConfig",
           "build_gpt_datasets", "build_t5_datasets", "inspect_t5_splits"]


def __getattr__(name: str) -> Any:
    """Import the torch-dependent names on first access (PEP 562)."""
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'samplers' has no attribute {name!r}")
