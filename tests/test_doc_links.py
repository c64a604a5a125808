"""Every relative link in the READMEs and docs/ resolves: the front door and the pages behind it cannot rot.

Checked files: README.md, README.zh-CN.md, every docs/*.md and benchmarks/README.md. A link is a Markdown
``[text](target)`` or ``![alt](target)`` outside fenced code blocks and inline code; links with a scheme
(``https:``, ``mailto:``) are not followed. Promised for every other link:

- its path (relative to the file holding it; empty for the same file) names an existing file or folder;
- a ``#fragment`` pointing into a Markdown file names one of that file's headings, slugged as GitHub does
  (lowercase; every character that is not a letter, digit, space, ``-`` or ``_`` dropped; spaces become
  ``-``; the second heading of the same slug gets ``-1``, the third ``-2``).
"""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CHECKED = sorted({ROOT / "README.md", ROOT / "README.zh-CN.md", ROOT / "benchmarks" / "README.md",
                  *(ROOT / "docs").glob("*.md")})
FENCE = re.compile(r"^\s*(```|~~~)")
INLINE_CODE = re.compile(r"(`+).*?\1")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
# Inline Markdown a heading's text may hold; GitHub slugs the rendered text, so the markup goes first.
LINK_IN_HEADING = re.compile(r"!?\[([^\]]*)\]\([^)]*\)")


def prose_lines(text: str) -> list[tuple[int, str]]:
    """(1-based line number, line) of every line outside fenced code blocks, inline code removed."""
    lines, fenced = [], False
    for number, line in enumerate(text.splitlines(), start=1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append((number, INLINE_CODE.sub("", line)))
    return lines


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading's text (before the duplicate suffix)."""
    text = LINK_IN_HEADING.sub(r"\1", heading).replace("`", "").lower()
    kept = "".join(character for character in text
                   if character in " -_" or unicodedata.category(character)[0] in "LNM")
    return kept.replace(" ", "-")


def anchors(markdown: Path) -> set[str]:
    """Every heading anchor of a Markdown file, duplicates numbered as GitHub numbers them."""
    seen: dict[str, int] = {}
    found = set()
    text = markdown.read_text(encoding="utf-8")
    fenced = False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        match = None if fenced else HEADING.match(line)
        if match:
            slug = github_slug(match.group(2))
            count = seen.get(slug, 0)
            seen[slug] = count + 1
            found.add(slug if count == 0 else f"{slug}-{count}")
    return found


def relative_links() -> list[tuple[str, Path, str]]:
    """(file:line, file, target) of every relative link in the checked files."""
    links = []
    for markdown in CHECKED:
        for number, line in prose_lines(markdown.read_text(encoding="utf-8")):
            for match in LINK.finditer(line):
                target = match.group(1)
                if not SCHEME.match(target):
                    links.append((f"{markdown.relative_to(ROOT)}:{number}", markdown, target))
    return links


LINKS = relative_links()


def test_the_checked_files_exist_and_link_to_each_other():
    assert (ROOT / "docs" / "README.md") in CHECKED and len(CHECKED) > 4
    targets = {target for _, _, target in LINKS}
    assert any(target.startswith("docs/") for target in targets)


@pytest.mark.parametrize(("where", "markdown", "target"), LINKS, ids=[where for where, _, _ in LINKS])
def test_the_link_resolves(where, markdown, target):
    path, _, fragment = target.partition("#")
    resolved = (markdown.parent / path).resolve() if path else markdown
    assert resolved.exists(), f"{where}: {target}: no such file {resolved}"
    if fragment and resolved.suffix == ".md":
        assert fragment in anchors(resolved), f"{where}: {target}: no heading #{fragment} in {resolved.name}"


@pytest.mark.parametrize(("heading", "slug"), [
    ("## Samplers: splits, epochs, blends, caches", "samplers-splits-epochs-blends-caches"),
    ("### ZeRO stages, CPU offload and DeepSpeed configs", "zero-stages-cpu-offload-and-deepspeed-configs"),
    ("## preprocess-data", "preprocess-data"),
    ("## 从 OneFlow GPT 过来：预处理 → 预训练 → 分布式", "从-oneflow-gpt-过来预处理--预训练--分布式"),
    ("## `train` and [links](x.md)", "train-and-links"),
])
def test_headings_are_slugged_as_github_slugs_them(heading, slug):
    assert github_slug(HEADING.match(heading).group(2)) == slug
