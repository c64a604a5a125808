"""How each token format's files are named: the Arrow folder and its state file, MindRecord data files
and their SQLite indexes. Shared by the format modules, the registry (`formats`), merge and conversion."""

from __future__ import annotations

import re

ARROW_STATE_FILE = "state.json"
# How a dataset of each format is named after a stem (what preprocess-data and merge-datasets write).
ARROW_FOLDER_SUFFIX = "_arrow"
MINDRECORD_SUFFIX = ".mindrecord"
# Beside every MindRecord data file: its SQLite index, `<data file>.db`.
MINDRECORD_INDEX_SUFFIX = ".db"
_MINDRECORD_NAME = re.compile(r"\.mindrecord\d*$")


def is_mindrecord_name(path: str) -> bool:
    """Whether `path` names a MindRecord data file (`x.mindrecord`, or shard `x.mindrecordN`)."""
    return _MINDRECORD_NAME.search(str(path)) is not None


def mindrecord_files_name(path: str, num_shards: int) -> str:
    """How messages name the data files of the MindRecord `path`: `x.mindrecord` itself for one shard,
    `x.mindrecord0..3` for four (no `x.mindrecord` exists then)."""
    return str(path) if num_shards == 1 else f"{path}0..{num_shards - 1}"
