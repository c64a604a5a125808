"""Arrow shards: the `save_to_disk` layout, opened by Hugging Face `datasets` and by our reader."""

import json
import os
import subprocess
import sys
from pathlib import Path

import datasets
import numpy as np
import pyarrow as pa
import pytest

from indexed_dataset import TokenmillError, TokenRangeError
from indexed_dataset.arrow import ArrowReader, ArrowWriter
from indexed_dataset.errors import ShardFormatError

NUM_DOCUMENTS = 1200


@pytest.fixture(scope="module")
def documents() -> list[np.ndarray]:
    """Random documents, one in ten empty; ids span the whole uint16 range."""
    rng = np.random.default_rng(5)
    return [rng.integers(0, 2**16, rng.integers(1, 60) if i % 10 else 0) for i in range(NUM_DOCUMENTS)]


def flat(documents):
    lengths = np.array([len(d) for d in documents], dtype=np.int64)
    return np.concatenate(list(documents) + [np.zeros(0, np.int64)]), lengths[lengths > 0], (lengths > 0).astype(int)


@pytest.fixture(scope="module")
def saved(documents, tmp_path_factory) -> str:
    """A dataset written in uneven batches, small shards, with an `id` pass-through field."""
    path = str(tmp_path_factory.mktemp("arrow") / "corpus")
    with ArrowWriter(path, np.uint16, shard_size=20_000, batch_rows=100) as writer:
        for start in range(0, NUM_DOCUMENTS, 333):
            batch = documents[start : start + 333]
            writer.add_documents(*flat(batch), fields={"id": [f"doc-{start + i}" for i in range(len(batch))]})
    return path


def test_layout_is_save_to_disk_with_sequence_feature(saved):
    names = sorted(os.listdir(saved))
    shards = [n for n in names if n.endswith(".arrow")]
    assert len(shards) > 1
    assert shards == [f"data-{i:05d}-of-{len(shards):05d}.arrow" for i in range(len(shards))]
    assert names == shards + ["dataset_info.json", "state.json"]
    state = json.loads(open(os.path.join(saved, "state.json")).read())
    assert state["_data_files"] == [{"filename": n} for n in shards]
    int(state["_fingerprint"], 16)
    info = json.loads(open(os.path.join(saved, "dataset_info.json")).read())
    assert info["features"] == {
        "input_ids": {"feature": {"dtype": "int32", "_type": "Value"}, "_type": "Sequence"},
        "id": {"dtype": "string", "_type": "Value"},
    }
    with open(os.path.join(saved, shards[0]), "rb") as f:
        assert f.read(4) == b"\xff\xff\xff\xff"  # IPC stream format, as datasets writes


def test_load_from_disk_memory_maps_the_shards(saved, documents):
    dataset = datasets.load_from_disk(saved)
    assert len(dataset) == NUM_DOCUMENTS
    blocks = [block for row in dataset.data.blocks for block in row]  # one per shard, none copied
    assert len(blocks) > 1 and all(isinstance(b, datasets.table.MemoryMappedTable) for b in blocks)
    assert sorted(os.path.basename(f["filename"]) for f in dataset.cache_files) == sorted(
        n for n in os.listdir(saved) if n.endswith(".arrow")
    )
    assert dataset.features["input_ids"].feature.dtype == "int32"
    for i in (0, 10, 11, 777, NUM_DOCUMENTS - 1):
        assert dataset[i]["input_ids"] == documents[i].tolist()
        assert dataset[i]["id"] == f"doc-{i}"


def test_from_file_and_streaming_load_dataset_read_every_row(saved, documents):
    shards = sorted(os.path.join(saved, n) for n in os.listdir(saved) if n.endswith(".arrow"))
    rows = [row for shard in shards for row in datasets.Dataset.from_file(shard)["input_ids"]]
    assert rows == [d.tolist() for d in documents]
    streamed = datasets.load_dataset("arrow", data_files=shards, streaming=True, split="train")
    assert [row["input_ids"] for row in streamed] == [d.tolist() for d in documents]


def test_reader_gives_sequences_and_document_boundaries(saved, documents):
    reader = ArrowReader(saved)
    non_empty = [d for d in documents if len(d)]
    assert reader.dtype == np.uint16
    assert len(reader) == len(non_empty)
    assert reader.num_documents == NUM_DOCUMENTS
    assert reader.num_tokens == sum(map(len, documents))
    assert reader.document_indices.tolist() == [0] + np.cumsum([len(d) > 0 for d in documents]).tolist()
    assert all(np.array_equal(reader[i], non_empty[i]) for i in range(len(non_empty)))
    assert reader[5].dtype == np.uint16
    assert reader.field_values("id")[:2] == ["doc-0", "doc-1"]
    batch = reader.read_documents(8, 13)
    assert np.array_equal(batch.tokens, np.concatenate(documents[8:13]))
    assert batch.document_sequence_counts.tolist() == [int(len(d) > 0) for d in documents[8:13]]


def test_sequence_lengths_column_keeps_sentence_boundaries(tmp_path):
    path = str(tmp_path / "s")
    with ArrowWriter(path, np.int32, store_sequence_lengths=True) as writer:
        writer.add_document([1, 2, 3, 4, 5], [2, 0, 3])
        writer.add_document([], [])
        writer.add_document([9], [1])
    reader = ArrowReader(path)
    assert reader.sequence_lengths.tolist() == [2, 0, 3, 1]
    assert reader.document_indices.tolist() == [0, 3, 3, 4]
    assert datasets.load_from_disk(path)[0]["sequence_lengths"] == [2, 0, 3]


def test_several_sequences_without_the_option_are_refused(tmp_path):
    with pytest.raises(TokenmillError, match="document 1 has 2 sequences"):
        with ArrowWriter(str(tmp_path / "x"), np.int32) as writer:
            writer.add_documents(np.arange(5), np.array([1, 2, 2]), np.array([1, 2]))
    assert not (tmp_path / "x").exists()


def test_fields_must_match_the_first_batch(tmp_path):
    with pytest.raises(TokenmillError, match="fields"):
        with ArrowWriter(str(tmp_path / "f"), np.int32) as writer:
            writer.add_documents(np.arange(2), np.array([2]), np.array([1]), fields={"id": [1]})
            writer.add_documents(np.arange(2), np.array([2]), np.array([1]))


def test_empty_dataset_is_loadable(tmp_path):
    path = str(tmp_path / "empty")
    with ArrowWriter(path, np.uint16):
        pass
    assert os.listdir(path).count("data-00000-of-00001.arrow") == 1
    assert len(datasets.load_from_disk(path)) == 0
    assert len(ArrowReader(path)) == 0


def test_failure_leaves_no_dataset_behind(tmp_path):
    path = tmp_path / "failed"
    with pytest.raises(TokenRangeError, match="document 2"):
        with ArrowWriter(str(path), np.uint16, batch_rows=1) as writer:
            writer.add_documents(*flat([np.array([1]), np.array([2])]))
            writer.add_documents(*flat([np.array([70_000])]))
    assert not path.exists()


def test_failure_in_an_existing_empty_folder_keeps_the_folder_empty(tmp_path):
    path = tmp_path / "given"
    path.mkdir()
    with pytest.raises(RuntimeError):
        with ArrowWriter(str(path), np.uint16) as writer:
            writer.add_documents(*flat([np.array([1])]))
            raise RuntimeError("interrupted")
    assert os.listdir(path) == []


def test_non_empty_directory_is_refused(saved):
    with pytest.raises(TokenmillError, match="not empty"):
        ArrowWriter(saved, np.uint16)


def test_foreign_and_damaged_files_raise_one_clear_error(tmp_path):
    table = pa.table({"text": ["a"]})
    with pa.OSFile(str(tmp_path / "text.arrow"), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as stream:
        stream.write_table(table)
    with pytest.raises(ShardFormatError, match="no list-of-integers column 'input_ids'"):
        ArrowReader(str(tmp_path / "text.arrow"))
    (tmp_path / "junk.arrow").write_bytes(b"not arrow")
    with pytest.raises(ShardFormatError, match="junk.arrow: not a readable Arrow IPC file"):
        ArrowReader(str(tmp_path / "junk.arrow"))


# ------------------------------------------------------------------ older datasets releases (slow)
OLD_RELEASES = {
    # datasets 2.19 predates numpy 2 and was checked with pyarrow 15.
    "2.19.2": ["datasets==2.19.2", "pyarrow==15.0.2", "numpy<2"],
    "3.6.0": ["datasets==3.6.0", "pyarrow==20.0.0"],
}
PIP_TIMEOUT_S = 1200
READ_WITH_DATASETS = """
import json, sys
import datasets
path, shards, expected = sys.argv[1], json.loads(sys.argv[2]), json.load(open(sys.argv[3]))
loaded = datasets.load_from_disk(path)
assert loaded["input_ids"] == expected["input_ids"] and loaded["id"] == expected["id"], "load_from_disk"
assert [r for s in shards for r in datasets.Dataset.from_file(s)["input_ids"]] == expected["input_ids"], "from_file"
streamed = datasets.load_dataset("arrow", data_files=shards, streaming=True, split="train")
assert [row["input_ids"] for row in streamed] == expected["input_ids"], "streaming"
print("read", len(loaded), "rows with datasets", datasets.__version__)
"""


def release_python(version: str, root: Path) -> Path:
    """The Python of a new venv at ``root`` holding datasets==`version`, or skip if pip fails."""
    python = root / "bin" / "python"
    subprocess.run([sys.executable, "-m", "venv", str(root)], check=True)
    try:
        result = subprocess.run(
            [str(python), "-m", "pip", "install", "--quiet", "--no-cache-dir", *OLD_RELEASES[version]],
            capture_output=True, text=True, timeout=PIP_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        pytest.skip(f"pip install {' '.join(OLD_RELEASES[version])} took over {PIP_TIMEOUT_S} s")
    if result.returncode:
        last_line = (result.stderr.strip().splitlines() or ["no output"])[-1]
        pytest.skip(f"pip cannot install {' '.join(OLD_RELEASES[version])} (registry unreachable?): {last_line}")
    return python


@pytest.mark.slow
@pytest.mark.timeout(2 * PIP_TIMEOUT_S)
# The oldest release by default; the next under `-m campaign` (each is a fresh venv and ~30 s of pip).
@pytest.mark.parametrize("version", ["2.19.2", pytest.param("3.6.0", marks=pytest.mark.campaign)])
def test_older_datasets_releases_read_the_directory(version, saved, documents, tmp_path):
    python = release_python(version, tmp_path / "venv")
    shards = sorted(os.path.join(saved, n) for n in os.listdir(saved) if n.endswith(".arrow"))
    expected = tmp_path / "expected.json"
    expected.write_text(
        json.dumps({"input_ids": [d.tolist() for d in documents], "id": [f"doc-{i}" for i in range(NUM_DOCUMENTS)]})
    )
    result = subprocess.run(
        [str(python), "-c", READ_WITH_DATASETS, saved, json.dumps(shards), str(expected)],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert f"with datasets {version}" in result.stdout


def test_reader_opens_what_datasets_itself_saves(tmp_path):
    rows = [[5, 6, 7], [], [2**20]]
    datasets.Dataset.from_dict({"input_ids": rows, "text": ["a", "b", "c"]}).save_to_disk(str(tmp_path / "hf"))
    reader = ArrowReader(str(tmp_path / "hf"))
    assert reader.dtype == reader.table.schema.field("input_ids").type.value_type.to_pandas_dtype()
    assert reader.field_names == ["text"]
    assert [reader.document(i).tolist() for i in range(3)] == rows
    assert reader.document_indices.tolist() == [0, 1, 1, 2]
