"""Every script under `benchmarks/` answers ``--help`` with its options and exit status 0, and writes nothing.

The scripts are run, never imported, by users and by the device call (`benchmarks/README.md`), so a broken help
text (a ``%`` that argparse reads as a format) is found only by running them: here, all in one Python process,
as ``python -m benchmarks.NAME --help`` would run each.
"""

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
HELP_TIMEOUT_S = 300
# Runs each script as ``python -m`` does and prints ``module<TAB>exit status<TAB>first line of its help``.
RUN_EACH = """
import contextlib, io, runpy, sys
for module in sys.argv[1:]:
    sys.argv = [module, "--help"]
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        status = "returned"
    except SystemExit as exit:
        status = str(exit.code or 0)
    except Exception as error:
        status = f"raised {type(error).__name__}: {error}"
    print(module, status, out.getvalue().strip().splitlines()[0] if out.getvalue().strip() else "", sep="\\t",
          file=sys.__stdout__)
"""


def benchmark_modules() -> list[str]:
    """The runnable scripts: every module under benchmarks/ with a command line."""
    paths = sorted((REPO / "benchmarks").rglob("*.py"))
    return [".".join(path.relative_to(REPO).with_suffix("").parts) for path in paths
            if path.name != "__init__.py" and "ArgumentParser(" in path.read_text()]


def test_every_benchmark_script_answers_help(tmp_path):
    modules = benchmark_modules()
    assert "benchmarks.gpu_step" in modules and "benchmarks.device.run" in modules
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    result = subprocess.run([sys.executable, "-c", RUN_EACH, *modules], cwd=tmp_path, env=environment,
                            capture_output=True, text=True, timeout=HELP_TIMEOUT_S, check=True)
    answers = dict((line.split("\t")[0], line.split("\t")[1:]) for line in result.stdout.splitlines())
    assert set(answers) == set(modules), result.stderr[-2000:]
    for module, (status, first_line) in answers.items():
        assert status == "0" and first_line.startswith("usage:"), (module, status, first_line)
    assert not list(tmp_path.iterdir())  # make_corpus.py once wrote its 100 MB corpus to a file named --help
