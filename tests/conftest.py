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


# The variables that point every library's scratch, cache and config directories somewhere (tempfile's,
# the XDG cache and config folders pip, Hugging Face and matplotlib default to, and their own), and the
# folder each gets.
BYPRODUCT_DIRECTORIES = {"TMPDIR": "tmp", "XDG_CACHE_HOME": "cache", "XDG_CONFIG_HOME": "config",
                         "HF_HOME": "huggingface", "HF_DATASETS_CACHE": "datasets", "PIP_CACHE_DIR": "pip",
                         "MPLCONFIGDIR": "matplotlib"}
_saved_environment: dict[str, str] = {}


def pytest_sessionstart(session):
    """Before any test module is imported (``datasets`` makes its cache folder on import): point the
    byproduct directories into this session's pytest temporary folder, for this process and every child
    it starts. pytest removes the folder when the session passes (``tmp_path_retention_policy =
    "failed"`` in pyproject.toml), so a test run leaves nothing outside the repository but pytest's own
    ``.pytest_cache``."""
    root = session.config._tmp_path_factory.mktemp("session")  # what tmp_path_factory itself uses
    _saved_environment.update(os.environ)
    for variable, name in BYPRODUCT_DIRECTORIES.items():
        (root / name).mkdir()
        os.environ[variable] = str(root / name)
    tempfile.tempdir = None  # recomputed from TMPDIR on next use


def campaign_selected(config: pytest.Config) -> bool:
    """Whether ``-m`` asks for the campaign (``-m campaign``, ``-m "campaign and slow"``; not ``"not campaign"``)."""
    expression = config.getoption("markexpr") or ""
    return "campaign" in expression and "not campaign" not in expression


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A test marked ``campaign`` (an exhaustive grid, a minutes-long compile, a load-sensitive figure) is
    skipped unless ``-m`` selects the campaign: the default run stays within its time budget, and names
    what it left out."""
    if campaign_selected(config):
        return
    skip = pytest.mark.skip(reason="runs with `pytest -m campaign`")
    for item in items:
        if item.get_closest_marker("campaign"):
            item.add_marker(skip)


def pytest_sessionfinish(session, exitstatus):
    if _saved_environment:
        os.environ.clear()
        os.environ.update(_saved_environment)
        tempfile.tempdir = None
