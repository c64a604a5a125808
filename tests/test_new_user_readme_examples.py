"""The README's ``train`` examples run as written on the bundled data (issue 27, point 3).

Promised: the first ``train`` block of docs/training.md, the page the README links for ``train`` (train a tiny GPT, ``generate`` from it with no tokenizer
flag, resume it with no shape flag) runs on the quickstart's token files, each command within
`EXAMPLE_CPU_BUDGET_S` of CPU time (user + system of the command's processes: wall time on a shared machine
measures the neighbours). The data and every output go under pytest's temporary folder instead of runs/.
"""

from __future__ import annotations

import os
import re
import resource
import shlex
import subprocess
import sys
from pathlib import Path

from preprocess.cli import main as preprocess_data

REPO = Path(__file__).resolve().parents[1]
EXAMPLE_CPU_BUDGET_S = 30.0
COMMAND_TIMEOUT_S = 300
SCRIPTS = {"train": "trainer.cli.train", "generate": "trainer.cli.generate"}


def _train_block() -> list[list[str]]:
    """The commands of the first bash block of docs/training.md's "## train" section (comments dropped)."""
    text = (REPO / "docs" / "training.md").read_text(encoding="utf-8")
    section = text[text.index("\n## train\n"):]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    return [shlex.split(line, comments=True) for line in block.replace("\\\n", " ").splitlines() if line.strip()]


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def test_readme_train_examples_run_as_written(tmp_path):
    runs = tmp_path / "runs"
    tokenizer = ["--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", str(REPO / "data_test/gpt2/gpt2-vocab.json"),
                 "--merge-file", str(REPO / "data_test/gpt2/gpt2-merges.txt")]
    (runs / "quickstart").mkdir(parents=True)  # as the quickstart script makes it
    assert preprocess_data(["--input", str(REPO / "data_test/sample_en.jsonl"), "--output-prefix",
                            str(runs / "quickstart" / "sample"), *tokenizer, "--append-eod", "--workers", "1"]) == 0
    commands = _train_block()
    assert [words[0] for words in commands] == ["train", "generate", "train"]
    for words in commands:
        argv = [word.replace("runs/", f"{runs}/") for word in words[1:]]
        before = _cpu_seconds()
        result = subprocess.run([sys.executable, "-m", SCRIPTS[words[0]], *argv], cwd=REPO, capture_output=True,
                                text=True, timeout=COMMAND_TIMEOUT_S, env={**os.environ, "TMPDIR": str(tmp_path)})
        spent = _cpu_seconds() - before
        assert result.returncode == 0, f"{shlex.join(words)}\n{result.stderr[-2000:]}"
        assert spent < EXAMPLE_CPU_BUDGET_S, f"{shlex.join(words)}: {spent:.1f} s of CPU"
    assert (runs / "gpt-tiny" / "latest_checkpointed_iteration.txt").read_text().strip() == "20"
