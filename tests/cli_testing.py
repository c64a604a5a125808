"""What a refused command looks like to its user, checked one way for every test that needs it."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser, as the tomli backport (`[test]` installs it there)
    import tomli as tomllib

PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"


def console_scripts() -> dict[str, str]:
    """Script name -> its module (``train`` -> ``trainer.cli.train``), from pyproject.toml."""
    scripts = tomllib.loads(PYPROJECT.read_text())["project"]["scripts"]
    return {name: target.split(":")[0] for name, target in scripts.items()}


def refused(main: Callable[[list[str]], int], argv: list[str], capsys, prog: str) -> str:
    """Run ``main(argv)``; it must exit non-zero (argparse's SystemExit included) with exactly one stderr line,
    ``<prog>: error: ...``, and no traceback. Returns that line."""
    try:
        code = main(argv)
    except SystemExit as exit_:
        code = exit_.code
    err = capsys.readouterr().err
    assert code != 0, err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"{prog}: error: ")
    return lines[0]


# An installed command's own limit in these tests: a refusal takes a second; a hang must fail the test, not CI.
COMMAND_TIMEOUT_S = 120
BIN = os.path.dirname(sys.executable)


def run_cli(program: str, *argv: str, cwd, **options) -> tuple[int, str]:
    """Run the installed command ``program`` as a user types it; returns (exit code, stderr). ``options`` go to
    `subprocess.run` (``preexec_fn`` to limit its memory, say)."""
    result = subprocess.run([os.path.join(BIN, program), *argv], cwd=cwd, capture_output=True, text=True,
                            timeout=COMMAND_TIMEOUT_S, **options)
    return result.returncode, result.stderr


def assert_one_line(code: int, err: str, *expected: str) -> str:
    """A refused command's stderr: exit code != 0, no Python traceback or Rust panic, exactly one line (log lines
    at INFO aside), holding each of ``expected``. Returns the line."""
    assert code != 0
    assert "Traceback" not in err and "panicked" not in err, err
    lines = [line for line in err.strip().splitlines() if not line.startswith("INFO ")]
    assert len(lines) == 1, lines
    for text in expected:
        assert text in lines[0], lines[0]
    return lines[0]
