"""The data tools never write over data that is not an output of theirs (issues 26 and 34).

Promised, for preprocess-data, merge-datasets, convert, plot-metrics and inspect-index --plot:
* an output name that holds a directory of the user's (empty or not), a symbolic link, or a FIFO is
  refused in one line naming it, and nothing there is removed or changed;
* an output that is one of the command's inputs (however spelled: `./a`, `d/../d/a`, an absolute path
  through a symbolic link to the folder, `A` for the dataset `A_arrow`) is refused in one line;
* an empty output prefix is refused in one line;
* what an earlier run of ours left at the output names (regular files, our Arrow folders) is replaced,
  as before (tests/preprocess/test_interruption_and_rerun.py covers the reruns in depth).

Every refusal: a non-zero exit, exactly one line on stderr naming the path, no traceback, and the whole
temporary tree byte for byte as it was.
"""

from __future__ import annotations

import json
import os
import shutil

import pytest
from preprocess_testing import GPT2_FLAGS, GPT2_VOCAB, write_jsonl
from refusal_testing import assert_refused, tree_digest, write_dataset, write_saved_texts

from indexed_dataset.formats import dataset_path, open_reader
from preprocess import cli as preprocess_cli
from preprocess import convert_cli, merge_cli
from trainer.cli import inspect as inspect_cli
from trainer.cli import plot as plot_cli

pytestmark = pytest.mark.timeout(120)

FORMATS = ("mmap", "arrow", "mindrecord")


def _corpus(tmp_path) -> str:
    return write_jsonl(str(tmp_path / "in.jsonl"), [{"text": f"Document {i} says hello."} for i in range(5)])


def _preprocess_argv(tmp_path, *flags: str) -> list[str]:
    return ["--input", _corpus(tmp_path), "--output-prefix", str(tmp_path / "out"), *GPT2_FLAGS, *flags]


# ---------------------------------------------------------------- something not ours at an output name
def _user_directory(path: str, tmp_path) -> None:
    os.makedirs(path)
    with open(os.path.join(path, "notes.txt"), "w") as f:
        f.write("the user's own file\n")


def _empty_directory(path: str, tmp_path) -> None:
    os.makedirs(path)


def _link_to_user_file(path: str, tmp_path) -> None:
    target = tmp_path / "elsewhere.txt"
    target.write_text("the user's file behind a link\n")
    os.symlink(target, path)


def _link_to_user_directory(path: str, tmp_path) -> None:
    target = tmp_path / "elsewhere"
    _user_directory(str(target), tmp_path)
    os.symlink(target, path)


def _fifo(path: str, tmp_path) -> None:
    os.mkfifo(path)


def _regular_file(path: str, tmp_path) -> None:
    with open(path, "w") as f:
        f.write("a file where a folder is written\n")


FILE_OCCUPANTS = {"empty directory": _empty_directory, "user directory": _user_directory,
                  "link to a file": _link_to_user_file, "link to a directory": _link_to_user_directory,
                  "fifo": _fifo}
# The Arrow output is a folder: a folder of ours (or an empty one) is replaced; these are not ours.
FOLDER_OCCUPANTS = {"user directory": _user_directory, "regular file": _regular_file,
                    "link to a directory": _link_to_user_directory, "fifo": _fifo}
# (format, the name under the output stem that is occupied)
OUTPUT_NAMES = [("mmap", ".bin"), ("mmap", ".idx"), ("mindrecord", ".mindrecord"),
                ("mindrecord", ".mindrecord.db")]
OCCUPIED = ([(fmt, suffix, kind) for fmt, suffix in OUTPUT_NAMES for kind in FILE_OCCUPANTS]
            + [("arrow", "_arrow", kind) for kind in FOLDER_OCCUPANTS])


@pytest.mark.parametrize(("fmt", "suffix", "kind"), OCCUPIED)
def test_preprocess_refuses_an_output_name_that_is_not_its_own(tmp_path, capfd, fmt, suffix, kind):
    occupied = str(tmp_path / f"out_text_document{suffix}")
    (FILE_OCCUPANTS if fmt != "arrow" else FOLDER_OCCUPANTS)[kind](occupied, tmp_path)
    argv = _preprocess_argv(tmp_path, "--output-format", fmt)
    before = tree_digest(tmp_path)
    assert_refused(capfd, preprocess_cli.main, argv, naming=occupied)
    assert tree_digest(tmp_path) == before


@pytest.mark.parametrize("kind", ["user directory", "fifo"])
def test_a_fanned_out_part_refuses_before_clearing_its_outputs(tmp_path, capfd, kind):
    occupied = str(tmp_path / "out_part0-of-2_text_document.bin")
    FILE_OCCUPANTS[kind](occupied, tmp_path)
    argv = _preprocess_argv(tmp_path, "--rank", "0", "--world-size", "2")
    before = tree_digest(tmp_path)
    assert_refused(capfd, preprocess_cli.main, argv, naming=occupied)
    assert tree_digest(tmp_path) == before


def test_preprocess_replaces_the_outputs_of_an_earlier_run(tmp_path):
    argv = _preprocess_argv(tmp_path, "--output-format", *FORMATS)
    assert preprocess_cli.main(argv) == 0
    assert preprocess_cli.main([*argv, "--append-eod"]) == 0  # another command: every output replaced
    assert len(open_reader(str(tmp_path / "out_text_document"))[0]) == len(open_reader(
        str(tmp_path / "out_text_document_arrow"))[0])


def test_preprocess_refuses_to_write_over_its_own_input(tmp_path, capfd):
    # A saved dataset of texts that happens to sit where the run writes its Arrow output.
    saved = write_saved_texts(tmp_path / "out_text_document_arrow", [["one text", "another text"]])
    argv = ["--input", saved, "--output-prefix", str(tmp_path / "out"), *GPT2_FLAGS, "--output-format", "arrow"]
    before = tree_digest(tmp_path)
    assert_refused(capfd, preprocess_cli.main, argv, naming=saved)
    assert tree_digest(tmp_path) == before


def test_preprocess_refuses_to_write_over_its_tokenizer(tmp_path, capfd):
    vocab = tmp_path / "out_text_document.bin"
    shutil.copyfile(GPT2_VOCAB, vocab)
    argv = _preprocess_argv(tmp_path)
    argv[argv.index(GPT2_VOCAB)] = str(vocab)
    before = tree_digest(tmp_path)
    assert_refused(capfd, preprocess_cli.main, argv, naming=str(vocab))
    assert tree_digest(tmp_path) == before


# ---------------------------------------------------------------- the output is one of the inputs
def _spellings(tmp_path, name: str) -> dict[str, str]:
    """Ways to spell `tmp_path/data/name` (run from `tmp_path`)."""
    os.symlink(tmp_path / "data", tmp_path / "linked")
    return {"same": str(tmp_path / "data" / name), "relative": os.path.join(".", "data", name),
            "dotdot": os.path.join("data", "..", "data", name), "linked folder": str(tmp_path / "linked" / name)}


SPELLINGS = ["same", "relative", "dotdot", "linked folder"]


@pytest.mark.parametrize("spelling", SPELLINGS)
@pytest.mark.parametrize("fmt", FORMATS)
def test_merge_refuses_an_output_that_is_an_input(tmp_path, capfd, monkeypatch, fmt, spelling):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    a = write_dataset(fmt, str(tmp_path / "data" / "a"))
    b = write_dataset(fmt, str(tmp_path / "data" / "b"), offset=10)
    # The output prefix `a` names `a_arrow` / `a.mindrecord`: the input itself.
    prefix = _spellings(tmp_path, "a")[spelling]
    before = tree_digest(tmp_path)
    assert_refused(capfd, merge_cli.main, ["--inputs", a, b, "--output-prefix", prefix],
                   naming=dataset_path(fmt, prefix))
    assert tree_digest(tmp_path) == before


@pytest.mark.parametrize("fmt", FORMATS)
def test_merge_of_a_directory_refuses_an_output_among_its_datasets(tmp_path, capfd, fmt):
    write_dataset(fmt, str(tmp_path / "a"))
    write_dataset(fmt, str(tmp_path / "b"), offset=10)
    before = tree_digest(tmp_path)
    assert_refused(capfd, merge_cli.main, ["--input", str(tmp_path), "--output-prefix", str(tmp_path / "b")],
                   naming=dataset_path(fmt, str(tmp_path / "b")))
    assert tree_digest(tmp_path) == before


@pytest.mark.parametrize("spelling", SPELLINGS)
@pytest.mark.parametrize("fmt", FORMATS)
def test_convert_refuses_the_input_as_its_output(tmp_path, capfd, monkeypatch, fmt, spelling):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    source = write_dataset(fmt, str(tmp_path / "data" / "a"))
    output = _spellings(tmp_path, os.path.basename(source))[spelling]
    before = tree_digest(tmp_path)
    assert_refused(capfd, convert_cli.main, ["--from", fmt, "--to", fmt, source, output], naming=output)
    assert tree_digest(tmp_path) == before


@pytest.mark.parametrize("fmt", ["mmap", "arrow"])
def test_convert_refuses_an_output_holding_the_input_named_by_one_file(tmp_path, capfd, fmt):
    dataset = write_dataset(fmt, str(tmp_path / "a"))
    # The input named by one of its files: the mmap `.idx`, one shard of the Arrow folder.
    source = dataset + ".idx" if fmt == "mmap" else os.path.join(dataset, "data-00000-of-00001.arrow")
    before = tree_digest(tmp_path)
    assert_refused(capfd, convert_cli.main, ["--from", fmt, "--to", fmt, source, dataset], naming=dataset)
    assert tree_digest(tmp_path) == before


@pytest.mark.parametrize("kind", ["user directory", "link to a file", "fifo"])
@pytest.mark.parametrize("command", ["merge-datasets", "convert"])
def test_merge_and_convert_refuse_an_output_name_that_is_not_theirs(tmp_path, capfd, command, kind):
    a = write_dataset("mmap", str(tmp_path / "a"))
    b = write_dataset("mmap", str(tmp_path / "b"), offset=10)
    occupied = str(tmp_path / "merged.idx")
    FILE_OCCUPANTS[kind](occupied, tmp_path)
    if command == "convert":
        main, argv = convert_cli.main, ["--from", "mmap", "--to", "mmap", a, str(tmp_path / "merged")]
    else:
        main, argv = merge_cli.main, ["--inputs", a, b, "--output-prefix", str(tmp_path / "merged")]
    before = tree_digest(tmp_path)
    assert_refused(capfd, main, argv, naming=occupied)
    assert tree_digest(tmp_path) == before


@pytest.mark.parametrize("command", ["preprocess-data", "merge-datasets", "convert"])
def test_an_empty_output_prefix_is_refused(tmp_path, capfd, monkeypatch, command):
    monkeypatch.chdir(tmp_path)
    a = write_dataset("mmap", str(tmp_path / "a"))
    mains = {"preprocess-data": (preprocess_cli.main, [*_preprocess_argv(tmp_path)[:2], "--output-prefix", "",
                                                       *GPT2_FLAGS]),
             "merge-datasets": (merge_cli.main, ["--inputs", a, "--output-prefix", ""]),
             "convert": (convert_cli.main, ["--from", "mmap", "--to", "mmap", a, ""])}
    main, argv = mains[command]
    before = tree_digest(tmp_path.parent)
    assert_refused(capfd, main, argv, naming="empty")
    assert tree_digest(tmp_path.parent) == before


# ---------------------------------------------------------------- pictures over their inputs
def _metrics(path) -> str:
    path.write_text("".join(json.dumps({"iteration": i, "lm_loss": 5.0 - i}) + "\n" for i in range(1, 4)))
    return str(path)


@pytest.mark.parametrize("case", ["same", "linked folder", "metrics.jsonl", "second input"])
def test_plot_metrics_refuses_to_draw_over_a_metrics_file(tmp_path, capfd, case):
    (tmp_path / "run").mkdir()
    metrics = _metrics(tmp_path / "run" / "metrics.png")  # a metrics file with a picture's name
    other = _metrics(tmp_path / "run" / "other.jsonl")
    os.symlink(tmp_path / "run", tmp_path / "linked")
    runs, out = {"same": ([metrics], metrics),
                 "linked folder": ([metrics], str(tmp_path / "linked" / "metrics.png")),
                 "metrics.jsonl": ([other], other),
                 "second input": ([other, metrics], metrics)}[case]
    before = tree_digest(tmp_path)
    assert_refused(capfd, plot_cli.main, [*runs, "--out", out], naming=out)
    assert tree_digest(tmp_path) == before


@pytest.mark.parametrize("case", ["index file", "tokenizer file"])
def test_inspect_plot_refuses_to_draw_over_an_input(tmp_path, capfd, case):
    prefix = write_dataset("mmap", str(tmp_path / "a"))
    vocab = tmp_path / "vocab.svg"
    shutil.copyfile(GPT2_VOCAB, vocab)
    out = {"index file": prefix + ".idx", "tokenizer file": str(vocab)}[case]
    flags = ["--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", str(vocab), "--merge-file", GPT2_FLAGS[-1]]
    before = tree_digest(tmp_path)
    assert_refused(capfd, inspect_cli.main, [prefix, "--plot", out, *flags], naming=out)
    assert tree_digest(tmp_path) == before
