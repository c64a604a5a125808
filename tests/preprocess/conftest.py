"""Fixtures of the preprocess tests."""

from __future__ import annotations

import os

import pytest


@pytest.fixture
def files_in(tmp_path):
    """The names of the files left in a directory (to check that nothing was left behind)."""
    return lambda directory=tmp_path: sorted(os.listdir(directory))
