"""The README's quickstart is what CI runs: its second command appears verbatim in `.ci/run`."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def quickstart_commands() -> list[str]:
    section = (ROOT / "README.md").read_text().split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    return [block.strip() for block in re.findall(r"```bash\n(.*?)```", section, re.S)]


def test_the_quickstart_has_two_one_line_commands():
    commands = quickstart_commands()
    assert len(commands) == 2 and all("\n" not in command for command in commands)


def test_ci_runs_the_readme_test_command_verbatim():
    ci_lines = (ROOT / ".ci" / "run").read_text().splitlines()
    assert quickstart_commands()[1] in ci_lines
