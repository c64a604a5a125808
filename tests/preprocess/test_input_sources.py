"""preprocess-data inputs: many files, globs and directories at once in sorted path order; JSON lines
(plain, gzip, zstd), Parquet, Arrow IPC (file and stream), save_to_disk folders and --hf-dataset all give
the bytes of the same documents as JSON lines; columnar errors name `file:row N`."""

from __future__ import annotations

import gzip
import json
import os
import pickle
import threading

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from preprocess import cli
from preprocess import inputs
from preprocess.columnar import RecordBatchChunk
from preprocess.inputs import resolve_inputs
from preprocess_testing import same_dataset, write_jsonl

NULL_FLAGS = ["--tokenizer-type", "NullTokenizer", "--vocab-size", "1000"]
DOCUMENTS = [{"text": " ".join(str((3 * i + j) % 997) for j in range(i % 9)), "id": i} for i in range(120)]


def run(tmp_path, inputs, *flags, name="out"):
    argv = ["--input", *map(str, inputs)] if inputs else []
    return cli.main([*argv, "--output-prefix", str(tmp_path / name), *NULL_FLAGS, "--append-eod",
                     "--chunk-bytes", "300", *flags])


@pytest.fixture
def reference(tmp_path):
    """The prefix of the JSON-lines run over DOCUMENTS."""
    source = write_jsonl(str(tmp_path / "reference.jsonl"), DOCUMENTS)
    assert run(tmp_path, [source], name="reference") == 0
    return str(tmp_path / "reference_text_document")


def table_of(documents) -> pa.Table:
    return pa.table({"id": [d["id"] for d in documents], "text": [d["text"] for d in documents]})


def write_input(path: str, kind: str, documents) -> str:
    table = table_of(documents)
    if kind == "parquet":
        pq.write_table(table, path, row_group_size=25)
    elif kind in ("arrow-file", "arrow-stream"):
        opener = pa.ipc.new_file if kind == "arrow-file" else pa.ipc.new_stream
        with pa.OSFile(path, "wb") as sink, opener(sink, table.schema) as writer:
            for batch in table.to_batches(max_chunksize=40):
                writer.write_batch(batch)
    elif kind == "zst":
        with pa.CompressedOutputStream(path, "zstd") as f:
            f.write(b"".join(json.dumps(d).encode() + b"\n" for d in documents))
    elif kind == "gz":
        with gzip.open(path, "wb") as f:
            f.write(b"".join(json.dumps(d).encode() + b"\n" for d in documents))
    return path


@pytest.mark.parametrize(("kind", "name"), [("parquet", "in.parquet"), ("arrow-file", "in.arrow"),
                                            ("arrow-stream", "in.arrow"), ("zst", "in.jsonl.zst"),
                                            ("gz", "in.json.gz")])
def test_each_format_gives_the_json_lines_bytes(tmp_path, reference, kind, name):
    source = write_input(str(tmp_path / name), kind, DOCUMENTS)
    assert run(tmp_path, [source]) == 0
    assert same_dataset(str(tmp_path / "out_text_document"), reference)


@pytest.mark.parametrize(("kind", "name"), [("jsonl", "in.jsonl"), ("gz", "in.jsonl.gz"), ("zst", "in.jsonl.zst")])
def test_a_named_pipe_gives_the_json_lines_bytes(tmp_path, reference, kind, name):
    """`--input <(zcat corpus.gz)` and friends: a pipe has no size and no seek, read it as a stream."""
    source = str(tmp_path / ("file." + name))
    write_jsonl(source, DOCUMENTS) if kind == "jsonl" else write_input(source, kind, DOCUMENTS)
    content = open(source, "rb").read()
    fifo = str(tmp_path / name)
    os.mkfifo(fifo)

    def feed() -> None:
        with open(fifo, "wb") as pipe:
            pipe.write(content)

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    assert run(tmp_path, [fifo], "--partitions", "2") == 0
    feeder.join(timeout=10)
    assert same_dataset(str(tmp_path / "out_text_document"), reference)


def test_a_save_to_disk_folder_and_the_hf_dataset_flag(tmp_path, reference):
    folder = str(tmp_path / "saved")
    datasets.Dataset.from_dict(table_of(DOCUMENTS).to_pydict()).save_to_disk(folder, max_shard_size=2000)
    assert len([name for name in os.listdir(folder) if name.endswith(".arrow")]) > 1
    assert run(tmp_path, [folder]) == 0
    assert same_dataset(str(tmp_path / "out_text_document"), reference)
    assert run(tmp_path, [], "--hf-dataset", "json", "--hf-data-files", str(tmp_path / "reference.jsonl"),
               name="hf") == 0
    assert same_dataset(str(tmp_path / "hf_text_document"), reference)


def test_hf_dataset_never_reaches_the_hub(tmp_path, capsys):
    assert run(tmp_path, [], "--hf-dataset", "someone/some-corpus") == 1
    assert "never downloads" in capsys.readouterr().err


def test_files_globs_and_directories_at_once_in_sorted_path_order(tmp_path, reference):
    """Pieces named so that sorted path order is the reference order, given in scrambled order."""
    (tmp_path / "b_dir").mkdir()
    (tmp_path / "c_shards").mkdir()
    write_jsonl(str(tmp_path / "a.jsonl"), DOCUMENTS[:20])
    write_input(str(tmp_path / "b_dir" / "1.parquet"), "parquet", DOCUMENTS[20:50])
    write_jsonl(str(tmp_path / "b_dir" / "2.jsonl"), DOCUMENTS[50:60])
    (tmp_path / "b_dir" / "notes.txt").write_text("not an input")
    write_input(str(tmp_path / "c_shards" / "x1.jsonl.gz"), "gz", DOCUMENTS[60:100])
    write_input(str(tmp_path / "c_shards" / "x2.arrow"), "arrow-file", DOCUMENTS[100:])
    specs = [str(tmp_path / "c_shards" / "x*"), str(tmp_path / "b_dir"), str(tmp_path / "a.jsonl"),
             str(tmp_path / "b_dir" / "2.jsonl")]
    assert [os.path.relpath(p, tmp_path) for p in resolve_inputs(specs)] == [
        "a.jsonl", "b_dir/1.parquet", "b_dir/2.jsonl", "c_shards/x1.jsonl.gz", "c_shards/x2.arrow"]
    assert run(tmp_path, specs) == 0
    assert same_dataset(str(tmp_path / "out_text_document"), reference)


def test_a_list_of_strings_column_is_already_split_sentences(tmp_path):
    pieces = [["1 2", "3"], [], ["4"], ["", "5 6"]]
    pq.write_table(pa.table({"text": pieces}), str(tmp_path / "in.parquet"))
    write_jsonl(str(tmp_path / "in.jsonl"), [{"text": p} for p in pieces])
    assert run(tmp_path, [tmp_path / "in.parquet"], "--split-sentences", name="columnar") == 0
    assert run(tmp_path, [tmp_path / "in.jsonl"], "--split-sentences", name="lines") == 0
    assert same_dataset(str(tmp_path / "columnar_text_sentence"), str(tmp_path / "lines_text_sentence"))


@pytest.mark.parametrize(
    ("table", "reason"),
    [(pa.table({"body": ["1"] * 50}), "in.parquet:row 0: missing column 'text' (columns: body)"),
     (pa.table({"text": list(range(50))}), "in.parquet:row 0: column 'text' holds int64, expected strings"),
     (pa.table({"text": ["1"] * 37 + [None] + ["2"] * 12}), "in.parquet:row 37: key 'text' holds null")],
)
def test_columnar_errors_name_file_and_row(tmp_path, capsys, files_in, table, reason):
    pq.write_table(table, str(tmp_path / "in.parquet"))
    assert run(tmp_path, [tmp_path / "in.parquet"]) == 1
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and error[0].startswith("preprocess-data: error: ") and reason in error[0]
    assert files_in() == ["in.parquet"]


def test_null_rows_are_skipped_with_skip_invalid(tmp_path):
    texts = ["1 2", None, "3", None, "4 5 6"]
    pq.write_table(pa.table({"text": texts}), str(tmp_path / "in.parquet"))
    write_jsonl(str(tmp_path / "in.jsonl"), [{"text": t} for t in texts if t is not None])
    assert run(tmp_path, [tmp_path / "in.parquet"], "--skip-invalid", name="skipped") == 0
    assert run(tmp_path, [tmp_path / "in.jsonl"], name="clean") == 0
    assert same_dataset(str(tmp_path / "skipped_text_document"), str(tmp_path / "clean_text_document"))


def test_zstd_without_a_codec_is_one_clear_line(tmp_path, capsys, monkeypatch):
    source = write_input(str(tmp_path / "in.jsonl.zst"), "zst", DOCUMENTS)
    monkeypatch.setattr(inputs, "zstd_available", lambda: False)
    assert run(tmp_path, [source]) == 1
    assert "no zstd codec" in capsys.readouterr().err


@pytest.mark.parametrize(("name", "reason"), [("in.csv", "unsupported input"), ("nothing*.jsonl", "no such file")])
def test_unsupported_or_missing_inputs(tmp_path, capsys, name, reason):
    if "*" not in name:
        (tmp_path / name).write_text("a,b\n")
    assert run(tmp_path, [tmp_path / name]) == 1
    assert reason in capsys.readouterr().err


def test_columnar_chunks_travel_to_worker_processes_with_only_their_rows(tmp_path, reference):
    source = write_input(str(tmp_path / "in.arrow"), "arrow-stream", DOCUMENTS)
    assert run(tmp_path, [source], "--workers", "2") == 0
    assert same_dataset(str(tmp_path / "out_text_document"), reference)
    big = pa.RecordBatch.from_pydict({"text": ["x" * 100] * 10_000})
    chunk = RecordBatchChunk("big.arrow", 5, big.slice(5, 10), 0)
    copy = pickle.loads(pickle.dumps(chunk))
    assert copy.batch.equals(chunk.batch) and (copy.source, copy.first_row) == ("big.arrow", 5)
    assert len(pickle.dumps(chunk)) < 100 * 10 + 4096  # the 10 rows, not the 1 MB parent


def test_columnar_kept_fields_reach_the_arrow_rows(tmp_path, capsys):
    source = write_input(str(tmp_path / "in.parquet"), "parquet", DOCUMENTS)
    assert run(tmp_path, [source], "--output-format", "arrow", "--keep-fields", "id") == 0
    loaded = datasets.load_from_disk(str(tmp_path / "out_text_document_arrow"))
    assert loaded["id"] == [d["id"] for d in DOCUMENTS]
    assert run(tmp_path, [source], "--output-format", "arrow", "--keep-fields", "src", name="other") == 1
    assert "in.parquet:row 0: missing column 'src' (columns: id, text)" in capsys.readouterr().err
