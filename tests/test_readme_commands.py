"""Every command line the READMEs show parses with the real command's parser: the docs cannot drift.

A command is a line of a ```bash block in README.md, README.zh-CN.md or a page of docs/ (backslash continuations joined,
`#` comments dropped, leading `NAME=value` environment assignments skipped) whose first word is one of
our console scripts (`[project.scripts]` in pyproject.toml). It is parsed by that script's
`build_parser()` exactly as the shell would hand it over. Two placeholders are documented and handled:

- ``<same flags>`` stands for the flags of the previous command of the same script in the same block;
  they are put in its place, and the result must parse.
- ``...`` elides flags: the word is dropped and the command is parsed with every option optional, so
  each flag still shown must exist and take the values given.

`train` lines that elide nothing are also turned into a full `TrainConfig` (the value checks `train`
runs before anything starts), with the environment's launch variables cleared.
"""

from __future__ import annotations

import importlib
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest

from cli_testing import console_scripts

ROOT = Path(__file__).resolve().parent.parent
READMES = ("README.md", "README.zh-CN.md")
# The README is the front door; the reference for each command lives in docs/, one page per topic.
DOCS = tuple(sorted(str(path.relative_to(ROOT)) for path in (ROOT / "docs").glob("*.md")))
SAME_FLAGS = "<same flags>"
ELISION = "..."
ENVIRONMENT_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
# The launch variables `train` reads its defaults from (CPM-Pretrain's and LiBai's): a README line may set
# them, and the machine running the tests must not.
LAUNCH_VARIABLES = ("GPUS_PER_NODE", "NNODES", "NODE", "NODE_RANK", "MASTER_ADDR", "ADDR", "MASTER_PORT", "PORT")


@dataclass(frozen=True)
class Command:
    where: str
    """README:line of the command's first line."""
    script: str
    words: tuple[str, ...]
    """The arguments after the script name, placeholders resolved."""
    elided: bool


def _logical_lines(block: str, first_line: int) -> list[tuple[int, str]]:
    """(line number, text) of each logical line of a bash block (continuations joined)."""
    lines, pending, start = [], "", first_line
    for offset, line in enumerate(block.splitlines()):
        if not pending:
            start = first_line + offset
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        lines.append((start, pending + line))
        pending = ""
    return lines


def readme_commands(readme: str) -> list[Command]:
    text = (ROOT / readme).read_text(encoding="utf-8")
    scripts = console_scripts()
    commands = []
    for match in re.finditer(r"```bash\n(.*?)```", text, re.S):
        first_line = text.count("\n", 0, match.start(1)) + 1
        previous: dict[str, tuple[str, ...]] = {}
        for number, line in _logical_lines(match.group(1), first_line):
            same = SAME_FLAGS in line
            words = shlex.split(line.replace(SAME_FLAGS, ""), comments=True)
            while words and ENVIRONMENT_ASSIGNMENT.match(words[0]):
                words = words[1:]
            if not words or words[0] not in scripts:
                continue
            script, arguments = words[0], tuple(words[1:])
            if same:
                assert script in previous, f"{readme}:{number}: {SAME_FLAGS} without an earlier {script} command"
                arguments = previous[script] + arguments
            elided = ELISION in arguments
            arguments = tuple(word for word in arguments if word != ELISION)
            previous[script] = arguments
            commands.append(Command(f"{readme}:{number}", script, arguments, elided))
    return commands


ALL_COMMANDS = [command for readme in READMES + DOCS for command in readme_commands(readme)]


def test_both_readmes_show_commands_of_every_kind():
    for readme in READMES:
        shown = {command.script for command in readme_commands(readme)}
        assert {"preprocess-data", "inspect-index", "train", "convert-checkpoint", "generate",
                "plot-metrics"} <= shown, (readme, shown)


def test_every_docs_page_with_a_bash_block_is_parsed():
    """The reference moved from README.md to docs/: its commands must still be found there."""
    pages = {command.where.split(":")[0] for command in ALL_COMMANDS}
    assert {f"docs/{name}.md" for name in ("preprocessing", "token-files", "training", "zero", "moe", "t5",
                                            "bert-and-squad", "evaluation", "huggingface-and-generation",
                                            "pictures")} <= pages


@pytest.fixture(autouse=True)
def _no_launch_variables(monkeypatch):
    for name in LAUNCH_VARIABLES:
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize("command", ALL_COMMANDS, ids=[command.where for command in ALL_COMMANDS])
def test_the_command_parses(command, capsys):
    module = importlib.import_module(console_scripts()[command.script])
    parser = module.build_parser()
    if command.elided:
        for action in parser._actions:
            action.required = False
    try:
        args = parser.parse_args(list(command.words))
    except SystemExit:
        pytest.fail(f"{command.where}: {command.script} {shlex.join(command.words)}\n{capsys.readouterr().err}")
    if command.script == "train" and not command.elided:
        from trainer.cli.train_args import config_from_args

        config_from_args(args)


def test_the_chinese_quickstart_runs_the_same_two_commands():
    def quickstart(readme: str, heading: str) -> list[str]:
        section = (ROOT / readme).read_text(encoding="utf-8").split(heading, 1)[1].split("\n## ", 1)[0]
        return [block.strip() for block in re.findall(r"```bash\n(.*?)```", section, re.S)]

    assert quickstart("README.zh-CN.md", "## 快速上手") == quickstart("README.md", "## Quickstart")
