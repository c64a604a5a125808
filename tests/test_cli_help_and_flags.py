"""Every command's flags: exact names only, one-line errors naming the nearest flag, and honest --help.

The rules are checked by walking every command's parser, so a flag added later is held to them too.
"""

import argparse
import dataclasses
import typing

import pytest

from indexed_dataset.cli_parser import HelpFormatter
from preprocess import cli as preprocess_cli
from preprocess import convert_cli, merge_cli
from trainer.cli import inspect as inspect_cli
from samplers import cli as build_indices_cli
from trainer.cli import train as train_cli
from trainer.cli import convert as convert_checkpoint_cli
from trainer.cli import generate as generate_cli
from trainer.cli import plot as plot_cli
from trainer.cli.train_args import _sections, build_parser as build_train_parser

PARSERS = {
    "preprocess-data": preprocess_cli.build_parser,
    "inspect-index": inspect_cli.build_parser,
    "merge-datasets": merge_cli.build_parser,
    "convert": convert_cli.build_parser,
    "build-indices": build_indices_cli.build_parser,
    "train": build_train_parser,
    "convert-checkpoint": convert_checkpoint_cli.build_parser,
    "generate": generate_cli.build_parser,
    "plot-metrics": plot_cli.build_parser,
}


def arguments(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [action for action in parser._actions if not isinstance(action, argparse._HelpAction)]


def help_line(action: argparse.Action) -> str:
    """The action's help as --help prints it (defaults appended, %-formatted)."""
    text = HelpFormatter("prog")._get_help_string(action)
    return text % {**vars(action), "prog": "prog"}


@pytest.fixture(params=sorted(PARSERS))
def parser(request) -> argparse.ArgumentParser:
    return PARSERS[request.param]()


def test_every_argument_has_help(parser):
    missing = [action.option_strings or action.dest for action in arguments(parser) if not (action.help or "").strip()]
    assert missing == []


def test_options_with_a_default_show_it(parser):
    """A value default is shown (by the formatter or by the text itself); a switch never says "(default: True)"."""
    for action in arguments(parser):
        text = help_line(action)
        default = action.default
        if action.nargs == 0 or isinstance(default, bool):
            assert "(default: True)" not in text and "(default: False)" not in text, action.option_strings
        elif default is not None and default not in ([], ()):
            assert "default" in text.lower(), action.option_strings


def test_help_text_is_clean(parser):
    text = parser.format_help()
    for stray in ("(default: None)", "(default: True)", "(default: False)", "``", "(default: [])"):
        assert stray not in text
    assert parser.description and "``" not in parser.description


def test_no_prefix_matching(parser):
    assert parser.allow_abbrev is False


def test_every_numeric_train_flag_documents_its_valid_range():
    undocumented = []
    for _, section in _sections():
        hints = typing.get_type_hints(section)
        for field in dataclasses.fields(section):
            kinds = set(typing.get_args(hints[field.name])) - {type(None)} or {hints[field.name]}
            if kinds & {int, float} and field.metadata.get("valid") is None:
                undocumented.append(field.name)
    assert undocumented == []
    assert "AdamW beta1. Valid: in [0, 1)." in build_train_parser().format_help().replace("\n", " ").replace(
        "                        ", "")


@pytest.mark.parametrize(("main", "argv", "nearest"), [
    (preprocess_cli.main, ["--inptu", "corpus.jsonl", "--output-prefix", "o"], "--input"),
    (inspect_cli.main, ["data/p", "--vaildate"], "--validate"),
    (merge_cli.main, ["--input", "d", "--output-prefx", "o"], "--output-prefix"),
    (convert_cli.main, ["--from", "mmap", "--to", "arrow", "a", "b", "--dtpye", "uint16"], "--dtype"),
    (build_indices_cli.main, ["--seq-length", "8", "--data-pth", "p"], "--data-path"),
    (train_cli.main, ["--dataset", "p", "--vocab-sizes", "3"], "--vocab-size"),
    (train_cli.main, ["--dataset", "p", "--loss-scale-w", "3"], "--loss-scale-window"),  # no prefix matching
    (convert_checkpoint_cli.main, ["--from-hf", "d", "--to", "c", "--tensor-parallel-size", "2"],
     "--tensor-model-parallel-size"),
    (generate_cli.main, ["--load", "c", "--max-tokens", "3"], "--max-new-tokens"),
])
def test_an_unknown_flag_is_one_line_naming_the_nearest(main, argv, nearest, capsys):
    try:
        code = main(argv)
    except SystemExit as exit_:
        code = exit_.code
    assert code != 0
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    assert "unrecognized argument" in lines[0] and lines[0].endswith(f"(did you mean {nearest}?)")


def test_train_without_data_names_both_flags(capsys):
    assert train_cli.main(["--vocab-size", "256", "--device", "cpu"]) != 0
    assert capsys.readouterr().err.strip() == "train: error: no training data: give --dataset or --data-path"
