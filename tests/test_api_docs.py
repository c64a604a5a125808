"""docs/api.md's examples run: every ```python block of the page, in order, in one namespace, from a fresh
folder holding only a link to the repository's data_test/ (issue 33, point 3).

Promised: the library call of every command on the page (preprocess_data, inspect/validate/decode, merge,
convert, build_indices, train, generate, evaluate, convert_checkpoint, plot_runs, finetune, predict) and
`Trainer` for both tasks work as written; the catchable-error example is refused with a `TokenmillError`;
the table names every command of pyproject.toml's [project.scripts].
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from cli_testing import console_scripts

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "api.md"
PYTHON_BLOCK = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)
# Commands without a library call of their own: `inspect-index`'s training view is `samplers.view`'s.
TABLE_ROW = re.compile(r"^\| `([a-z-]+)[^`]*` \|", re.MULTILINE)


def python_blocks() -> list[str]:
    return PYTHON_BLOCK.findall(PAGE.read_text(encoding="utf-8"))


def test_the_page_names_every_command():
    scripts = set(console_scripts())
    named = set(TABLE_ROW.findall(PAGE.read_text(encoding="utf-8")))
    assert scripts <= named, sorted(scripts - named)


def test_every_example_runs_in_order(tmp_path, monkeypatch, capsys):
    (tmp_path / "data_test").symlink_to(ROOT / "data_test")
    monkeypatch.chdir(tmp_path)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models on a shared machine
    namespace: dict = {"__name__": "api_docs"}
    try:
        for number, block in enumerate(python_blocks(), start=1):
            try:
                exec(compile(block, f"docs/api.md python block {number}", "exec"), namespace)
            except Exception as error:  # name the block that failed, then fail
                pytest.fail(f"docs/api.md python block {number} raised {error!r}:\n{block}")
    finally:
        torch.set_num_threads(threads)
    out = capsys.readouterr().out
    assert out.startswith("refused: ") and "no_such_text_document" in out.splitlines()[0]
    assert (tmp_path / "runs" / "gpt-hf" / "config.json").is_file()
    assert (tmp_path / "runs" / "gpt" / "metrics.png").is_file()
    assert "{'QA Metric': {'exact_match': " in out and "{'Perplexity Metric': {" in out
