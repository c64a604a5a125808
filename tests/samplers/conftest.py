"""Fixtures of the samplers tests: the golden index arrays and small synthetic datasets."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

from indexed_dataset import IndexedDatasetWriter


@pytest.fixture(scope="session")
def golden_indices(golden: Path) -> Path:
    """`data_test/megatron/indices/`: megatron-core 0.16.1's arrays for three configurations."""
    return golden / "indices"


@pytest.fixture(scope="session")
def manifest(golden_indices: Path) -> dict:
    return json.loads((golden_indices / "manifest.json").read_text())


def write_positional_dataset(prefix: Path, lengths: list[int] | np.ndarray) -> str:
    """A dataset whose token at global position p of the `.bin` is p (int32): contents reveal positions."""
    lengths = np.asarray(lengths, dtype=np.int64)
    with IndexedDatasetWriter(str(prefix), np.int32) as writer:
        writer.add_documents(np.arange(int(lengths.sum()), dtype=np.int32), lengths, np.ones(len(lengths), np.int64))
    return str(prefix)


@pytest.fixture
def positional_dataset(tmp_path: Path) -> Callable[..., str]:
    """Factory: `positional_dataset(lengths, name="x")` -> prefix of a new positional dataset."""

    def make(lengths, name: str = "positional") -> str:
        return write_positional_dataset(tmp_path / name, lengths)

    return make


@pytest.fixture(scope="module")
def three_datasets(tmp_path_factory) -> list[str]:
    """Prefixes of three positional datasets of 3, 40 and 400 sequences (1 to 49 tokens each)."""
    directory = tmp_path_factory.mktemp("three")
    rng = np.random.RandomState(0)
    return [write_positional_dataset(directory / f"d{i}", rng.randint(1, 50, size=n)) for i, n in enumerate((3, 40, 400))]
