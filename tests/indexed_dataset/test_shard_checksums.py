"""Damage in files we wrote does not pass silently (issue 26).

Promised, as a user types each command:

- `convert` and `merge-datasets` write a checksum manifest (`<output>.sha256sums`) beside every dataset they
  write (mmap, Arrow, MindRecord), without changing a byte of the dataset itself;
- reading such a dataset back (`convert`, `merge-datasets`), a flipped bit in an Arrow data buffer, a
  MindRecord blob or a `.bin`, a truncated or grown file: exit 1, one stderr line naming the damaged file,
  no traceback, no output left; `--no-verify` reads it anyway;
- `convert --vocab-size N`: an id outside [0, N) is one line naming the dataset and the document index.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from cli_testing import assert_one_line, run_cli

from indexed_dataset import IndexedDatasetWriter
from indexed_dataset.checksums import CHECKSUM_SUFFIX

GOLDEN_NAME = "sample_en_eod_text_document"


def flip_bit(path: Path, fraction: float = 0.5) -> None:
    """Flip the lowest bit of the byte at `fraction` of the file (inside the data, away from headers)."""
    data = bytearray(path.read_bytes())
    data[int(len(data) * fraction)] ^= 1
    path.write_bytes(bytes(data))


def listing(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


OUTPUT_NAMES = {"mmap": "ours_text_document", "arrow": "ours_arrow", "mindrecord": "ours.mindrecord"}


@pytest.fixture(scope="module")
def written_once(golden, tmp_path_factory) -> Path:
    """A folder holding the golden dataset converted by us into every format (with their manifests)."""
    directory = tmp_path_factory.mktemp("written")
    for fmt, name in OUTPUT_NAMES.items():
        code, err = run_cli("convert", "--from", "mmap", "--to", fmt, str(golden / GOLDEN_NAME), str(directory / name),
                            cwd=directory)
        assert code == 0, err
    return directory


@pytest.fixture
def written(written_once, tmp_path) -> dict[str, Path]:
    """This test's copy of `written_once` in tmp_path: format -> dataset path."""
    shutil.copytree(written_once, tmp_path, dirs_exist_ok=True)
    return {fmt: tmp_path / name for fmt, name in OUTPUT_NAMES.items()}


DATA_FILES = {"mmap": "ours_text_document.bin", "arrow": "ours_arrow/data-00000-of-00001.arrow",
              "mindrecord": "ours.mindrecord"}


def test_outputs_get_a_manifest_and_keep_their_bytes(golden, tmp_path, written):
    for fmt, output in written.items():
        assert Path(str(output) + CHECKSUM_SUFFIX).is_file(), fmt
    for suffix in (".bin", ".idx"):  # the manifest is beside the dataset, never in it
        ours, megatrons = tmp_path / f"ours_text_document{suffix}", golden / f"{GOLDEN_NAME}{suffix}"
        assert ours.read_bytes() == megatrons.read_bytes()


def _convert_to_mmap(fmt: str, dataset: Path, tmp_path: Path) -> tuple[str, list[str]]:
    return "convert", ["--from", fmt, "--to", "mmap", str(dataset), str(tmp_path / "out" / "back")]


def _convert_to_arrow(fmt: str, dataset: Path, tmp_path: Path) -> tuple[str, list[str]]:
    target = "mindrecord" if fmt == "arrow" else "arrow"
    name = "back.mindrecord" if target == "mindrecord" else "back_arrow"
    return "convert", ["--from", fmt, "--to", target, str(dataset), str(tmp_path / "out" / name)]


def _merge(fmt: str, dataset: Path, tmp_path: Path) -> tuple[str, list[str]]:
    return "merge-datasets", ["--inputs", str(dataset), str(dataset),
                              "--output-prefix", str(tmp_path / "out" / "merged")]


READERS = {"convert_to_mmap": _convert_to_mmap, "convert_to_other": _convert_to_arrow, "merge": _merge}


def _grow(path: Path) -> None:
    with open(path, "ab") as f:
        f.write(b"\0")


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:-1])


DAMAGE = {"bit_flip": flip_bit, "grown": _grow, "truncated": _truncate}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("damage", sorted(DAMAGE))
@pytest.mark.parametrize("reader", sorted(READERS))
@pytest.mark.parametrize("fmt", ["arrow", "mindrecord", "mmap"])
def test_damage_in_a_file_we_wrote_is_one_line_naming_it(tmp_path, written, fmt, reader, damage):
    data_file = tmp_path / DATA_FILES[fmt]
    DAMAGE[damage](data_file)
    (tmp_path / "out").mkdir()
    program, argv = READERS[reader](fmt, written[fmt], tmp_path)
    assert_one_line(*run_cli(program, *argv, cwd=tmp_path), str(data_file))
    assert listing(tmp_path / "out") == {}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("fmt", ["arrow", "mindrecord"])
def test_no_verify_reads_a_damaged_file_anyway(tmp_path, written, fmt):
    flip_bit(tmp_path / DATA_FILES[fmt])
    code, err = run_cli("convert", "--from", fmt, "--to", "mmap", "--no-verify", str(written[fmt]),
                        str(tmp_path / "back"), cwd=tmp_path)
    assert code == 0, err


@pytest.mark.timeout(300)
def test_merged_outputs_get_a_manifest_that_is_checked(golden, tmp_path):
    source = str(golden / GOLDEN_NAME)
    code, err = run_cli("merge-datasets", "--inputs", source, source, "--output-prefix", str(tmp_path / "m"),
                        cwd=tmp_path)
    assert code == 0, err
    assert (tmp_path / ("m" + CHECKSUM_SUFFIX)).is_file()
    flip_bit(tmp_path / "m.bin")
    code, err = run_cli("convert", "--from", "mmap", "--to", "arrow", str(tmp_path / "m"), str(tmp_path / "a_arrow"),
                        cwd=tmp_path)
    assert_one_line(code, err, str(tmp_path / "m.bin"), "damaged")


def _dataset_with_an_id(tmp_path: Path, bad_document: int, bad_id: int) -> str:
    prefix = str(tmp_path / "ids")
    lengths = np.full(8, 3, dtype=np.int64)
    tokens = np.arange(24, dtype=np.int32) % 100
    tokens[bad_document * 3 + 1] = bad_id
    with IndexedDatasetWriter(prefix, np.int32) as writer:
        writer.add_documents(tokens, lengths, np.ones(8, np.int64))
    return prefix


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("document", "bad_id", "batch"), [(0, 100, "8192"), (5, 1000, "8192"), (7, -1, "8192"),
                                                          (6, 100, "4")])
def test_an_id_outside_the_vocabulary_names_the_document(tmp_path, document, bad_id, batch):
    source = _dataset_with_an_id(tmp_path, document, bad_id)
    before = listing(tmp_path)
    code, err = run_cli("convert", "--from", "mmap", "--to", "arrow", "--vocab-size", "100", "--batch-documents",
                        batch, source, str(tmp_path / "out_arrow"), cwd=tmp_path)
    assert_one_line(code, err, source, f"document {document}", f"id {bad_id}")
    assert listing(tmp_path) == before


@pytest.mark.timeout(120)
def test_ids_inside_the_vocabulary_convert(tmp_path, golden):
    code, err = run_cli("convert", "--from", "mmap", "--to", "arrow", "--vocab-size", "50257",
                        str(golden / GOLDEN_NAME), str(tmp_path / "out_arrow"), cwd=tmp_path)
    assert code == 0, err


def _train_argv(dataset: str, cache: str) -> list[str]:
    # One step over every sample of the one epoch (20 documents of 20 tokens: 24 samples of 16 + 1 tokens).
    return ["--num-layers", "1", "--hidden-size", "16", "--num-attention-heads", "2", "--seq-length", "16",
            "--max-position-embeddings", "16", "--vocab-size", "128", "--make-vocab-size-divisible-by", "64",
            "--dataset", dataset, "--split", "100,0,0", "--data-cache-path", cache, "--micro-batch-size", "23",
            "--global-batch-size", "23", "--train-iters", "1", "--device", "cpu", "--lr", "0.001", "--eval-iters", "0"]


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("fmt", "bad_id"), [("mmap", 500), ("arrow", 128), ("mindrecord", 1000)])
def test_train_names_the_file_and_document_of_an_id_past_the_vocabulary(tmp_path, fmt, bad_id):
    prefix = str(tmp_path / "ids")
    tokens = np.arange(400, dtype=np.int32) % 100
    tokens[7 * 20 + 3] = bad_id  # document 7
    with IndexedDatasetWriter(prefix, np.int32) as writer:
        writer.add_documents(tokens, np.full(20, 20, dtype=np.int64), np.ones(20, np.int64))
    dataset = prefix
    if fmt != "mmap":
        dataset = str(tmp_path / ("ids_arrow" if fmt == "arrow" else "ids.mindrecord"))
        code, err = run_cli("convert", "--from", "mmap", "--to", fmt, prefix, dataset, cwd=tmp_path)
        assert code == 0, err
    code, err = run_cli("train", *_train_argv(dataset, str(tmp_path / "cache")), cwd=tmp_path)
    assert code != 0 and "Traceback" not in err, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("train: error:") and f"{dataset}: document 7" in last and f"id {bad_id}" in last, last


@pytest.mark.timeout(300)
@pytest.mark.parametrize("fmt", ["arrow", "mindrecord"])
def test_preprocess_parts_get_a_manifest_and_a_damaged_part_stops_the_merge(data_test, tmp_path, fmt):
    parts = tmp_path / "parts"
    parts.mkdir()
    tokenizer = ["--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", str(data_test / "gpt2" / "gpt2-vocab.json"),
                 "--merge-file", str(data_test / "gpt2" / "gpt2-merges.txt")]
    for rank in ("0", "1"):
        code, err = run_cli("preprocess-data", "--input", str(data_test / "sample_en.jsonl"), "--output-prefix",
                            str(parts / "c"), *tokenizer, "--output-format", fmt, "--rank", rank, "--world-size", "2",
                            cwd=tmp_path)
        assert code == 0, err
    name = "c_part1-of-2_text_document" + ("_arrow" if fmt == "arrow" else ".mindrecord")
    assert (parts / (name + CHECKSUM_SUFFIX)).is_file()
    data_file = parts / name / "data-00000-of-00001.arrow" if fmt == "arrow" else parts / name
    flip_bit(data_file)
    code, err = run_cli("merge-datasets", "--input", str(parts), "--output-prefix", str(tmp_path / "out" / "c"),
                        cwd=tmp_path)
    assert_one_line(code, err, str(data_file), "damaged")
    assert not (tmp_path / "out").exists()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("named", ["corpus.mindrecord", "corpus.mindrecord0", "corpus.mindrecord1"])
def test_a_damaged_shard_of_a_multi_shard_mindrecord_is_named(golden, tmp_path, named):
    code, err = run_cli("convert", "--from", "mmap", "--to", "mindrecord", "--mindrecord-shards", "2",
                        str(golden / GOLDEN_NAME), str(tmp_path / "corpus.mindrecord"), cwd=tmp_path)
    assert code == 0, err
    flip_bit(tmp_path / "corpus.mindrecord1")
    code, err = run_cli("convert", "--from", "mindrecord", "--to", "mmap", str(tmp_path / named),
                        str(tmp_path / "back"), cwd=tmp_path)
    assert_one_line(code, err, str(tmp_path / "corpus.mindrecord1"), "damaged")
