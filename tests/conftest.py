"""Shared fixtures: paths to the bundled test data (never outside the repository), and a session that
keeps every byproduct inside pytest's own temporary directory."""

import os
import tempfile
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


@pytest.fixture(scope="session", autouse=True)
def byproducts_stay_in_pytest_tmp(tmp_path_factory):
    """Point every library's scratch and cache directories into this session's pytest temporary folder.

    Temporary files (``tempfile``, in this process and in every child it starts), the XDG cache that pip,
    Hugging Face ``datasets``/``hub`` and others default to, and HF's own cache variables. pytest removes
    the folder when the session passes (``tmp_path_retention_policy = "failed"`` in pyproject.toml), so a
    test run leaves nothing outside the repository but pytest's own ``.pytest_cache``.
    """
    root = tmp_path_factory.mktemp("session")
    saved = dict(os.environ)
    for variable, name in (("TMPDIR", "tmp"), ("XDG_CACHE_HOME", "cache"), ("HF_HOME", "huggingface"),
                           ("HF_DATASETS_CACHE", "datasets"), ("PIP_CACHE_DIR", "pip")):
        (root / name).mkdir()
        os.environ[variable] = str(root / name)
    tempfile.tempdir = None  # recomputed from TMPDIR on next use
    yield root
    os.environ.clear()
    os.environ.update(saved)
    tempfile.tempdir = None
