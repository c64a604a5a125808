"""Every file a dataset's own manifest names must lie inside the dataset's folder (issues 26 and 34).

The manifests: a `save_to_disk` folder's `state.json` (`_data_files`), a MindRecord data file's header
(`shard_addresses`) and its `.db` (`SHARD_NAME`). An entry that is `..`-relative, absolute, the folder
itself, or a symbolic link leading out of the folder is refused by every command that reads datasets
(inspect-index, convert, merge-datasets, build-indices, train; preprocess-data for a saved dataset given
as input) in one line naming the manifest and the entry, with a non-zero exit and no traceback.

The file outside (a "sentinel") is a valid dataset file of its own: were it followed, the command would
succeed on its tokens. It is never opened from Python (an audit hook watches `open` and
`sqlite3.connect`), and nothing in the tree changes.

A saved dataset given to preprocess-data is read through its `state.json` list, never by the names in
the folder: a stale extra shard adds no documents, and a listed but missing shard is one line naming it.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import struct
import sys

import pytest
from preprocess_testing import GPT2_FLAGS
from refusal_testing import assert_refused, tree_digest, write_arrow_texts, write_dataset, write_saved_texts

from indexed_dataset.formats import open_reader, open_writer
from preprocess import cli as preprocess_cli
from preprocess import convert_cli, merge_cli
from samplers import cli as build_indices_cli
from trainer.cli import train as train_cli
from trainer.cli import inspect as inspect_cli

pytestmark = pytest.mark.timeout(180)

SHARD = "data-00000-of-00001.arrow"
SQLITE_URI = "file:"
# Paths opened from Python while a command runs (see `_opened`).
_OPENED: list[str] = []


def _audit(event: str, args: tuple) -> None:
    if event in ("open", "sqlite3.connect") and args and isinstance(args[0], (str, bytes, os.PathLike)):
        path = os.fsdecode(args[0])
        if event == "sqlite3.connect" and path.startswith(SQLITE_URI):  # file:PATH?mode=ro
            path = path[len(SQLITE_URI):].split("?")[0]
        _OPENED.append(path)


sys.addaudithook(_audit)


@pytest.fixture
def opened():
    """The paths the test's commands open from Python (audit hook events `open` and `sqlite3.connect`)."""
    _OPENED.clear()
    yield _OPENED
    _OPENED.clear()


def _commands(tmp_path, dataset: str, fmt: str) -> dict[str, tuple]:
    """command -> (main, argv) reading `dataset` as a user would type it."""
    cache = str(tmp_path / "cache")
    return {
        "inspect-index": (inspect_cli.main, [dataset]),
        "convert": (convert_cli.main, ["--from", fmt, "--to", "mmap", dataset, str(tmp_path / "converted")]),
        "merge-datasets": (merge_cli.main, ["--inputs", dataset, dataset, "--output-prefix", str(tmp_path / "merged")]),
        "build-indices": (build_indices_cli.main, ["--data-path", dataset, "--split", "100,0,0", "--seq-length", "4",
                                                   "--data-cache-path", cache]),
        "train": (train_cli.main, ["--data-path", dataset, "--num-layers", "1", "--hidden-size", "16",
                                   "--num-attention-heads", "2", "--seq-length", "4", "--vocab-size", "300",
                                   "--micro-batch-size", "1", "--global-batch-size", "1", "--train-iters", "1",
                                   "--device", "cpu", "--split", "100,0,0", "--eval-iters", "0",
                                   "--data-cache-path", cache]),
    }


COMMANDS = ["inspect-index", "convert", "merge-datasets", "build-indices", "train"]


def _check_refused(tmp_path, capfd, opened, command: str, dataset: str, fmt: str, naming: str, sentinel: str):
    main, argv = _commands(tmp_path, dataset, fmt)[command]
    before = tree_digest(tmp_path)
    opened.clear()  # only what the command opens counts
    line = assert_refused(capfd, main, argv, naming=naming)
    assert not [path for path in opened if os.path.realpath(path) == os.path.realpath(sentinel)]
    assert tree_digest(tmp_path) == before
    return line


# ---------------------------------------------------------------- Arrow: state.json's _data_files
def _arrow_with_entry(tmp_path, case: str) -> tuple[str, str]:
    """The Arrow dataset `data/a_arrow`, its state.json's first entry made to lead to `outside/`
    (a valid shard of another dataset). Returns (dataset, sentinel)."""
    dataset = write_dataset("arrow", str(tmp_path / "data" / "a"))
    outside = write_dataset("arrow", str(tmp_path / "outside" / "c"), offset=40)
    sentinel = os.path.join(outside, SHARD)
    state = os.path.join(dataset, "state.json")
    with open(state) as f:
        content = json.load(f)
    if case == "link":
        os.remove(os.path.join(dataset, SHARD))
        os.symlink(sentinel, os.path.join(dataset, SHARD))
    else:
        content["_data_files"][0]["filename"] = {
            "dotdot": os.path.relpath(sentinel, dataset), "absolute": sentinel, "parent": "..", "itself": ".",
            "not a name": 5}[case]
        with open(state, "w") as f:
            json.dump(content, f)
    return dataset, sentinel


ARROW_CASES = ["dotdot", "absolute", "link", "parent", "itself", "not a name"]


@pytest.mark.parametrize("case", ARROW_CASES)
@pytest.mark.parametrize("command", COMMANDS)
def test_arrow_state_entries_must_stay_in_the_folder(tmp_path, capfd, opened, command, case):
    dataset, sentinel = _arrow_with_entry(tmp_path, case)
    line = _check_refused(tmp_path, capfd, opened, command, dataset, "arrow",
                          naming=os.path.join(dataset, "state.json"), sentinel=sentinel)
    assert "_data_files[0]" in line


# ---------------------------------------------------------------- MindRecord: header and .db
def _set_shard_name(db_path: str, name: str) -> None:
    with sqlite3.connect(db_path) as db:
        db.execute("UPDATE SHARD_NAME SET NAME = ?", (name,))
    db.close()


def _set_header(path: str, change) -> None:
    """Rewrite the header JSON of a MindRecord data file in place (it is padded to header_size)."""
    with open(path, "r+b") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(length))
        change(header)
        text = json.dumps(header, separators=(",", ":")).encode()
        assert 8 + len(text) <= header["header_size"]
        f.seek(0)
        f.write(struct.pack("<Q", len(text)) + text + b"\0" * max(0, length - len(text)))


def _mindrecord_with_entry(tmp_path, case: str) -> tuple[str, str, str]:
    """The MindRecord dataset `data/a.mindrecord` (two shards) with one entry made to lead elsewhere.
    Returns (dataset, the manifest named in the message, sentinel)."""
    (tmp_path / "data").mkdir()
    (tmp_path / "outside").mkdir()
    dataset = str(tmp_path / "data" / "a.mindrecord")
    with open_writer("mindrecord", dataset, "int32", num_shards=2) as writer:
        for document in ([1, 2, 3], [4, 5], [6, 7, 8, 9]):
            writer.add_document(document, [len(document)])
    first, second = dataset + "0", dataset + "1"
    # A valid copy of shard 1 (and its index) outside the dataset's folder.
    sentinel = str(tmp_path / "outside" / "a.mindrecord1")
    shutil.copyfile(second, sentinel)
    shutil.copyfile(second + ".db", sentinel + ".db")
    if case == "shard link":
        os.remove(second)
        os.symlink(sentinel, second)
        return dataset, first, sentinel
    if case == "index link":
        os.remove(second + ".db")
        os.symlink(sentinel + ".db", second + ".db")
        return dataset, second, sentinel + ".db"
    if case == "header dotdot":
        relative = os.path.relpath(sentinel, os.path.dirname(first))
        for shard in (first, second):
            _set_header(shard, lambda header: header.update(shard_addresses=[os.path.basename(first), relative]))
        return dataset, first, sentinel
    # SHARD_NAME of shard 1's .db: out of the folder, or another file of it.
    other = str(tmp_path / "data" / "c.mindrecord")
    shutil.copyfile(second, other)
    name = {"db dotdot": os.path.relpath(sentinel, os.path.dirname(second)), "db absolute": sentinel,
            "db other file": os.path.basename(other)}[case]
    _set_shard_name(second + ".db", name)
    return dataset, second + ".db", sentinel


MINDRECORD_CASES = ["shard link", "index link", "header dotdot", "db dotdot", "db absolute", "db other file"]


@pytest.mark.parametrize("case", MINDRECORD_CASES)
@pytest.mark.parametrize("command", COMMANDS)
def test_mindrecord_entries_must_stay_in_the_folder(tmp_path, capfd, opened, command, case):
    dataset, manifest, sentinel = _mindrecord_with_entry(tmp_path, case)
    _check_refused(tmp_path, capfd, opened, command, dataset, "mindrecord", naming=manifest, sentinel=sentinel)


def test_untouched_datasets_still_read(tmp_path):
    """The checks refuse only what leads out: the crafted datasets' unmodified twins read as before."""
    arrow = write_dataset("arrow", str(tmp_path / "a"))
    mindrecord = write_dataset("mindrecord", str(tmp_path / "a"))
    assert [len(open_reader(path)) for path in (arrow, mindrecord)] == [3, 3]


# ---------------------------------------------------------------- preprocess-data's saved-dataset inputs
def _preprocess(tmp_path, saved: str) -> list[str]:
    return ["--input", saved, "--output-prefix", str(tmp_path / "out"), *GPT2_FLAGS]


def test_a_stale_extra_shard_adds_no_documents(tmp_path):
    saved = write_saved_texts(tmp_path / "saved", [["first text", "second text"]])
    write_arrow_texts(os.path.join(saved, "data-00001-of-00002.arrow"), ["left over", "from before"])
    assert preprocess_cli.main(_preprocess(tmp_path, saved)) == 0
    assert open_reader(str(tmp_path / "out_text_document")).num_documents == 2


def test_a_listed_shard_that_is_missing_is_one_line(tmp_path, capfd):
    saved = write_saved_texts(tmp_path / "saved", [["first text"], ["second text"]])
    os.remove(os.path.join(saved, "data-00001-of-00002.arrow"))
    before = tree_digest(tmp_path)
    line = assert_refused(capfd, preprocess_cli.main, _preprocess(tmp_path, saved),
                          naming=os.path.join(saved, "state.json"))
    assert "data-00001-of-00002.arrow" in line
    assert tree_digest(tmp_path) == before


@pytest.mark.parametrize("case", ["dotdot", "absolute", "link"])
def test_a_saved_input_naming_a_file_outside_is_refused(tmp_path, capfd, opened, case):
    saved = write_saved_texts(tmp_path / "saved", [["first text"]])
    sentinel = write_arrow_texts(tmp_path / "outside.arrow", ["a text outside the dataset"])
    state = os.path.join(saved, "state.json")
    if case == "link":
        os.remove(os.path.join(saved, SHARD))
        os.symlink(sentinel, os.path.join(saved, SHARD))
    else:
        with open(state, "w") as f:
            name = os.path.relpath(sentinel, saved) if case == "dotdot" else sentinel
            json.dump({"_data_files": [{"filename": name}]}, f)
    before = tree_digest(tmp_path)
    opened.clear()
    assert_refused(capfd, preprocess_cli.main, _preprocess(tmp_path, saved), naming=state)
    assert not [path for path in opened if os.path.realpath(path) == os.path.realpath(sentinel)]
    assert tree_digest(tmp_path) == before
