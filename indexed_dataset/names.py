"""How each token format's files are named: the Arrow folder and its state file, MindRecord data files
and their SQLite indexes. Shared by the format modules, the registry (`formats`), merge and conversion."""

from __future__ import annotations

import os
import re

ARROW_STATE_FILE = "state.json"
# The JSON files of a `save_to_disk` folder: the data file list, and the features.
ARROW_METADATA_FILES = (ARROW_STATE_FILE, "dataset_info.json")
# How a dataset of each format is named after a stem (what preprocess-data and merge-datasets write).
ARROW_FOLDER_SUFFIX = "_arrow"
MINDRECORD_SUFFIX = ".mindrecord"
# Beside every MindRecord data file: its SQLite index, `<data file>.db`.
MINDRECORD_INDEX_SUFFIX = ".db"
_MINDRECORD_NAME = re.compile(r"\.mindrecord\d*$")
# What our Arrow writer puts in a dataset folder (finished files and its own temporaries). A folder
# holding anything else is not ours to replace.
ARROW_OWN_FILE_NAMES = re.compile(r"data-\d{5}-of-\d{5}\.arrow|state\.json|dataset_info\.json|\..*\.tmp|.*\.json\.tmp")


def is_mindrecord_name(path: str) -> bool:
    """Whether `path` names a MindRecord data file (`x.mindrecord`, or shard `x.mindrecordN`)."""
    return _MINDRECORD_NAME.search(str(path)) is not None


def mindrecord_files_name(path: str, num_shards: int) -> str:
    """How messages name the data files of the MindRecord `path`: `x.mindrecord` itself for one shard,
    `x.mindrecord0..3` for four (no `x.mindrecord` exists then)."""
    return str(path) if num_shards == 1 else f"{path}0..{num_shards - 1}"


def shard_paths(path: str, num_shards: int) -> list[str]:
    """MindRecord data file names: `path` itself for one shard, else `path0` .. `path{N-1}`."""
    return [str(path)] if num_shards == 1 else [f"{path}{i}" for i in range(num_shards)]


def first_data_file(path: str) -> str:
    """The MindRecord data file to open for the dataset named `path`: `path` itself, or, when only
    shards `path0` .. `pathN-1` exist (a multi-shard dataset is named `x.mindrecord` by the commands
    that wrote it), `path0`."""
    if not os.path.exists(path) and os.path.exists(f"{path}0"):
        return f"{path}0"
    return path
