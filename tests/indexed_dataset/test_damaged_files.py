"""Damaged token files are never passed on, and every error names its file.

`inspect-index` (plain, `--json`, `--docs`, `--validate`), `merge-datasets` and `convert` check the
structure of everything they read before computing or copying anything: a damaged input is one
`prog: error: PATH: problem` line, a non-zero exit, and no output. The fault-injection campaign
(`damage_campaign.py`) runs a fast subset by default; the full campaign (460 damages, 2,300 runs) with
`pytest -m campaign`.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import struct

import numpy as np
import pytest

from damage_campaign import GOLDEN_MINDRECORD, GOLDEN_MMAP, OUTCOMES, run_campaign
from indexed_dataset import IndexFormatError, ShardFormatError, convert, open_reader
from preprocess import convert_cli, merge_cli
from trainer.cli import inspect as inspect_cli

# Outcomes a correct tool never produces (see damage_campaign.OUTCOMES).
WRONG_OUTCOMES = [outcome for outcome in OUTCOMES if outcome not in ("clean_error", "accepted")]
NUM_GOLDEN_SEQUENCES = 232


def _assert_no_wrong_outcome(counts, failures):
    assert {outcome: counts[outcome] for outcome in WRONG_OUTCOMES} == dict.fromkeys(WRONG_OUTCOMES, 0), \
        "\n".join(failures[:20])


def test_fast_campaign_no_traceback_hang_silent_success_or_leftover(tmp_path):
    counts, failures = run_campaign(str(tmp_path), fast=True)
    assert counts["damages"] >= 200
    _assert_no_wrong_outcome(counts, failures)
    assert counts["clean_error"] > counts["accepted"]


@pytest.mark.campaign
def test_full_campaign_no_traceback_hang_silent_success_or_leftover(tmp_path):
    counts, failures = run_campaign(str(tmp_path), fast=False)
    assert counts["damages"] >= 200
    _assert_no_wrong_outcome(counts, failures)


# ------------------------------------------------------------------------------------------------ helpers
def _golden_copy(directory, name="data") -> str:
    os.makedirs(directory, exist_ok=True)
    for ext in (".bin", ".idx"):
        shutil.copy(GOLDEN_MMAP + ext, os.path.join(directory, name + ext))
    return os.path.join(directory, name)


def _mindrecord_copy(directory) -> str:
    path = os.path.join(directory, os.path.basename(GOLDEN_MINDRECORD))
    for ext in ("", ".db"):
        shutil.copy(GOLDEN_MINDRECORD + ext, path + ext)
    return path


def _one_error_line(capsys, prog: str, *named: str) -> str:
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{prog}: error: "), captured.err
    assert "Traceback" not in captured.err
    for text in named:
        assert text in lines[0]
    return lines[0]


def _shift_length(prefix: str, sequence: int) -> None:
    """Move one token from sequence `sequence + 1` to `sequence`: the pointers no longer agree."""
    with open(prefix + ".idx", "r+b") as f:
        f.seek(34 + 4 * sequence)
        a, b = struct.unpack("<ii", f.read(8))
        f.seek(34 + 4 * sequence)
        f.write(struct.pack("<ii", a + 1, b - 1))


# ------------------------------------------------------------------------------------ merge and convert
def test_merge_refuses_a_length_shifted_by_one_and_writes_nothing(tmp_path, capsys):
    good, bad = _golden_copy(tmp_path, "a"), _golden_copy(tmp_path, "b")
    _shift_length(bad, 10)
    merged = str(tmp_path / "out" / "merged")
    os.makedirs(tmp_path / "out")
    assert merge_cli.main(["--inputs", good, bad, "--output-prefix", merged]) == 1
    _one_error_line(capsys, "merge-datasets", f"{bad}.idx: sequence 11 points to byte")
    assert os.listdir(tmp_path / "out") == []


@pytest.mark.parametrize("target", ["mmap", "arrow", "mindrecord"])
def test_convert_refuses_a_damaged_source_before_writing(tmp_path, capsys, target):
    bad = _golden_copy(tmp_path)
    with open(bad + ".idx", "r+b") as f:
        f.seek(34 + 4 * NUM_GOLDEN_SEQUENCES + 8 * NUM_GOLDEN_SEQUENCES + 8 * 100)  # document index 100
        f.write(struct.pack("<q", -5))
    output = str(tmp_path / {"mmap": "out", "arrow": "out_arrow", "mindrecord": "out.mindrecord"}[target])
    assert convert_cli.main(["--from", "mmap", "--to", target, bad, output]) == 1
    _one_error_line(capsys, "convert", f"{bad}.idx: document index 100 (-5, offset")
    assert sorted(os.listdir(tmp_path)) == ["data.bin", "data.idx"]


def test_a_damaged_arrow_part_stops_the_whole_merge_before_any_format_is_written(tmp_path, capsys):
    parts = tmp_path / "parts"
    for rank in range(2):
        prefix = _golden_copy(parts, f"c_part{rank}-of-2_text_document")
        convert(prefix, f"{prefix}_arrow", target_format="arrow")
    damaged = parts / "c_part1-of-2_text_document_arrow" / "data-00000-of-00001.arrow"
    os.truncate(damaged, os.path.getsize(damaged) // 2)
    (tmp_path / "out").mkdir()
    assert merge_cli.main(["--input", str(parts), "--output-prefix", str(tmp_path / "out" / "c")]) == 1
    _one_error_line(capsys, "merge-datasets", f"{damaged}: not a readable Arrow IPC file")
    assert os.listdir(tmp_path / "out") == []


def test_pyarrow_messages_name_the_file(tmp_path, capsys):
    """pyarrow says "Invalid flatbuffers message" or "Expected to be able to read N bytes": we add the path."""
    prefix = _golden_copy(tmp_path)
    arrow = str(tmp_path / "data_arrow")
    convert(prefix, arrow, target_format="arrow")
    shard = os.path.join(arrow, "data-00000-of-00001.arrow")
    with open(shard, "r+b") as f:
        f.seek(8)
        f.write(b"\xff" * 16)
    assert convert_cli.main(["--from", "arrow", "--to", "mmap", arrow, str(tmp_path / "out")]) == 1
    _one_error_line(capsys, "convert", f"{shard}: not a readable Arrow IPC file (")


def test_arrow_ids_wider_than_the_recorded_dtype_are_refused_not_wrapped(tmp_path):
    import pyarrow as pa

    from indexed_dataset.arrow import ArrowWriter

    with ArrowWriter(str(tmp_path / "x_arrow"), np.int32) as writer:
        writer.add_documents(np.array([1, 70000, 3]), np.array([3]), np.array([1]))
    state = tmp_path / "x_arrow" / "data-00000-of-00001.arrow"
    table = pa.ipc.open_stream(state.read_bytes()).read_all()  # a copy: the file is rewritten below
    metadata = dict(table.schema.metadata)
    metadata[b"tokenmill"] = json.dumps({"dtype": "uint16"}).encode()
    with pa.OSFile(str(state), "wb") as sink, pa.ipc.new_stream(sink, table.schema.with_metadata(metadata)) as out:
        out.write_table(table)
    with pytest.raises(ShardFormatError, match="token id 70000 in document 0 does not fit the dataset's dtype uint16"):
        open_reader(str(tmp_path / "x_arrow")).validate()


# -------------------------------------------------------------------------------------------- Arrow state
@pytest.mark.parametrize("command", ["inspect", "validate", "json", "merge", "convert"])
def test_arrow_state_without_data_files_is_one_line_in_every_command(tmp_path, capsys, command):
    arrow = str(tmp_path / "data_arrow")
    convert(_golden_copy(tmp_path), arrow, target_format="arrow")
    with open(os.path.join(arrow, "state.json"), "w") as f:
        json.dump({"_data_files": []}, f)
    out = str(tmp_path / "out")
    argv = {"inspect": [arrow], "validate": [arrow, "--validate"], "json": [arrow, "--json"],
            "merge": ["--inputs", arrow, "--output-prefix", out], "convert": ["--from", "arrow", "--to", "mmap", arrow, out]}
    main, prog = {"merge": (merge_cli.main, "merge-datasets"), "convert": (convert_cli.main, "convert")}.get(
        command, (inspect_cli.main, "inspect-index"))
    assert main(argv[command]) == 1
    _one_error_line(capsys, prog, "state.json: _data_files lists no data file")
    assert not os.path.exists(out + "_arrow") and not os.path.exists(out + ".bin")


# --------------------------------------------------------------------------------------------- MindRecord
def test_rows_deleted_from_the_mindrecord_index_are_found_not_dropped(tmp_path, capsys):
    path = _mindrecord_copy(tmp_path)
    with sqlite3.connect(path + ".db") as db:
        db.execute("DELETE FROM INDEXES WHERE ROW_ID >= 199 AND ROW_ID < 232")
    db.close()
    message = "INDEXES has 267 rows, but the data file's pages hold 300"
    with pytest.raises(ShardFormatError, match=message):
        open_reader(path)
    assert inspect_cli.main([path, "--validate"]) == 1
    _one_error_line(capsys, "inspect-index", f"{path}.db: {message}")
    assert convert_cli.main(["--from", "mindrecord", "--to", "mmap", path, str(tmp_path / "out")]) == 1
    _one_error_line(capsys, "convert", message)
    assert merge_cli.main(["--inputs", path, "--output-prefix", str(tmp_path / "merged")]) == 1
    _one_error_line(capsys, "merge-datasets", message)
    assert not [name for name in os.listdir(tmp_path) if name.startswith(("out", "merged"))]


@pytest.mark.parametrize("key,value,message", [
    ("page_size", None, "header page_size is None, not an integer"),
    ("page_size", "abc", "header page_size is 'abc', not an integer"),
    ("shard_addresses", [5], r"header shard_addresses is \[5\], not a non-empty list of file names"),
    ("shard_addresses", [], r"header shard_addresses is \[\], not a non-empty list of file names"),
])
def test_a_mindrecord_header_of_the_wrong_shape_is_one_line(tmp_path, capsys, key, value, message):
    path = _mindrecord_copy(tmp_path)
    raw = open(path, "rb").read()
    (length,) = struct.unpack_from("<Q", raw)
    header = json.loads(raw[8 : 8 + length])
    header[key] = value
    encoded = json.dumps(header).encode()
    with open(path, "r+b") as f:
        f.write(struct.pack("<Q", len(encoded)) + encoded)
    with pytest.raises(ShardFormatError, match=message):
        open_reader(path)
    for argv in ([path], [path, "--json"], [path, "--validate"]):
        assert inspect_cli.main(argv) == 1
        _one_error_line(capsys, "inspect-index", path)


def test_a_mindrecord_row_that_moved_in_its_page_is_found(tmp_path):
    path = _mindrecord_copy(tmp_path)
    with sqlite3.connect(path + ".db") as db:
        db.execute("UPDATE INDEXES SET PAGE_OFFSET_BLOB = PAGE_OFFSET_BLOB + 8 WHERE ROW_ID = 3")
    db.close()
    with pytest.raises(ShardFormatError, match=r"\.db: row 3 starts at page offset \d+, not where the row before"):
        open_reader(path)


# ---------------------------------------------------------------------------------------------- inspect
def test_without_validate_the_training_view_refuses_an_inconsistent_index(tmp_path, capsys):
    prefix = _golden_copy(tmp_path)
    _shift_length(prefix, 3)
    assert inspect_cli.main([prefix, "--seq-length", "64", "--data-cache-path", str(tmp_path / "cache")]) == 1
    _one_error_line(capsys, "inspect-index", f"{prefix}.idx: sequence 4 points to byte")


def test_every_reader_checks_on_open_what_it_reads(tmp_path):
    prefix = _golden_copy(tmp_path)
    _shift_length(prefix, 0)
    with pytest.raises(IndexFormatError, match=r"data\.idx: sequence 1 points to byte \d+ \(offset \d+\)"):
        open_reader(prefix)


# ------------------------------------------------------------------------------------ fan-out completeness
def _parts(directory, ranks, world, markers=None):
    for rank in ranks:
        _golden_copy(directory, f"c_part{rank}-of-{world}_text_document")
    if markers is not None:
        os.makedirs(os.path.join(directory, "c_done"))
        for rank in markers:
            open(os.path.join(directory, "c_done", f"c_part{rank}-of-{world}.done"), "w").write("x\n")


def test_merge_refuses_fan_out_parts_with_a_part_missing(tmp_path, capsys):
    parts = tmp_path / "parts"
    _parts(parts, [0, 1, 3], 4)
    assert merge_cli.main(["--input", str(parts), "--output-prefix", str(tmp_path / "m")]) == 1
    _one_error_line(capsys, "merge-datasets", "1 of 4 parts missing", str(parts / "c_part2-of-4_text_document"))
    listed = [str(parts / f"c_part{r}-of-4_text_document") for r in (0, 1, 3)]
    assert merge_cli.main(["--inputs", *listed, "--output-prefix", str(tmp_path / "m")]) == 1
    _one_error_line(capsys, "merge-datasets", "c_part2-of-4_text_document")
    assert not os.path.exists(tmp_path / "m.bin")


def test_merge_refuses_a_part_without_its_done_marker(tmp_path, capsys):
    parts = tmp_path / "parts"
    _parts(parts, range(4), 4, markers=[0, 2, 3])
    assert merge_cli.main(["--input", str(parts), "--output-prefix", str(tmp_path / "m")]) == 1
    _one_error_line(capsys, "merge-datasets", f"{parts / 'c_done'}: no done marker for c_part1-of-4")


def test_a_complete_set_of_marked_parts_merges(tmp_path):
    parts = tmp_path / "parts"
    _parts(parts, range(4), 4, markers=range(4))
    assert merge_cli.main(["--input", str(parts), "--output-prefix", str(tmp_path / "m")]) == 0
    assert len(open_reader(str(tmp_path / "m"))) == 4 * NUM_GOLDEN_SEQUENCES
