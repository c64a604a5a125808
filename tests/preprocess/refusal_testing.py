"""What a refused command must look like, and tiny datasets of every format to refuse over.

    before = tree_digest(tmp_path)
    assert_refused(capfd, merge_cli.main, argv, naming=str(tmp_path / "a.bin"))
    assert tree_digest(tmp_path) == before
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from collections.abc import Callable

import numpy as np
import pyarrow as pa

from indexed_dataset.formats import dataset_path, open_writer

# Three small documents (uint16 ids): enough for every reader, merge and conversion.
DOCUMENTS = ([1, 2, 3], [4, 5], [6, 7, 8, 9])


def tree_digest(root: str | os.PathLike) -> dict[str, str]:
    """Every entry under `root` (links not followed, FIFOs not opened): relative path -> its kind and
    the sha256 of its bytes (a file) or its target (a link)."""
    entries = {}
    for directory, folders, files in os.walk(root):
        for name in folders + files:
            path = os.path.join(directory, name)
            mode = os.lstat(path).st_mode
            if stat.S_ISLNK(mode):
                digest = "link " + os.readlink(path)
            elif stat.S_ISREG(mode):
                with open(path, "rb") as f:
                    digest = "file " + hashlib.sha256(f.read()).hexdigest()
            else:
                digest = "folder" if stat.S_ISDIR(mode) else f"mode {stat.S_IFMT(mode)}"
            entries[os.path.relpath(path, root)] = digest
    return entries


def assert_refused(capfd, main: Callable[[list[str]], int], argv: list[str], naming: str) -> str:
    """Run `main(argv)`; it must exit non-zero with exactly one line on stderr, naming `naming`, and no
    traceback. Returns the line."""
    capfd.readouterr()
    code = main(argv)
    error = capfd.readouterr().err
    assert code != 0, error
    assert "Traceback" not in error
    lines = error.strip().splitlines()
    assert len(lines) == 1, error
    assert naming in lines[0], lines[0]
    return lines[0]


def write_saved_texts(folder: str | os.PathLike, shards: list[list[str]]) -> str:
    """A `Dataset.save_to_disk`-style folder of a `text` column, one `data-*.arrow` per list of texts,
    all listed in its `state.json`. Returns the folder."""
    os.makedirs(folder)
    names = [f"data-{index:05d}-of-{len(shards):05d}.arrow" for index in range(len(shards))]
    for name, texts in zip(names, shards):
        write_arrow_texts(os.path.join(folder, name), texts)
    with open(os.path.join(folder, "state.json"), "w") as f:
        json.dump({"_data_files": [{"filename": name} for name in names], "_fingerprint": "0"}, f)
    with open(os.path.join(folder, "dataset_info.json"), "w") as f:
        json.dump({"features": {"text": {"dtype": "string", "_type": "Value"}}}, f)
    return str(folder)


def write_arrow_texts(path: str | os.PathLike, texts: list[str]) -> str:
    """One Arrow IPC stream file (as `save_to_disk` writes its shards) of a `text` column."""
    table = pa.table({"text": texts})
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as stream:
        stream.write_table(table)
    return str(path)


def write_dataset(fmt: str, stem: str, offset: int = 0) -> str:
    """A tiny dataset of format `fmt` named after `stem` (as preprocess-data names them); its ids are
    `DOCUMENTS` plus `offset`. Returns its path."""
    path = dataset_path(fmt, stem)
    with open_writer(fmt, path, np.uint16) as writer:
        for document in DOCUMENTS:
            writer.add_document(np.array(document, dtype=np.uint16) + offset, [len(document)])
    return path
