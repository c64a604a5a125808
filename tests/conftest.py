"""Shared fixtures: paths to the bundled test data (never outside the repository)."""

from pathlib import Path

import pytest

DATA_TEST = Path(__file__).resolve().parent.parent / "data_test"
GOLDEN = DATA_TEST / "megatron"


@pytest.fixture(scope="session")
def data_test() -> Path:
    """The repository's `data_test/` folder."""
    return DATA_TEST


@pytest.fixture(scope="session")
def golden() -> Path:
    """Golden outputs of Megatron's own tools (`data_test/megatron/`)."""
    return GOLDEN
