"""The README's top is what a newcomer starts from: an example command early, lines that fit a screen, and
links that lead somewhere (the full benchmark tables live in docs/benchmarks.md)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
FIRST_COMMAND_BY = 30
"""The first example command sits within this many lines of the top."""
TOP_LINES, TOP_WIDTH = 120, 160
"""No line of the first TOP_LINES is wider than TOP_WIDTH characters (benchmark tables belong in docs/)."""
LINK = re.compile(r"\]\(([^)\s]+)\)|^\[[^\]]+\]:\s*(\S+)", re.MULTILINE)
"""Inline links `[text](target)` and reference definitions `[name]: target`."""


def readme_lines() -> list[str]:
    return README.read_text(encoding="utf-8").splitlines()


def first_command_line(lines: list[str]) -> int | None:
    """The 1-based number of the first line of a fenced code block that is not blank or a comment."""
    fenced = False
    for number, line in enumerate(lines, start=1):
        if line.startswith("```"):
            fenced = not fenced
        elif fenced and line.strip() and not line.lstrip().startswith("#"):
            return number
    return None


def heading_anchor(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors_of(markdown: Path) -> set[str]:
    fenced = False
    anchors = set()
    for line in markdown.read_text(encoding="utf-8").splitlines():
        fenced ^= line.startswith("```")
        if not fenced and line.startswith("#"):
            anchors.add(heading_anchor(line.lstrip("#")))
    return anchors


def test_first_example_command_is_near_the_top() -> None:
    number = first_command_line(readme_lines())
    assert number is not None and number <= FIRST_COMMAND_BY, (
        f"README.md: the first example command is on line {number}; move an example (the two commands) "
        f"within the first {FIRST_COMMAND_BY} lines"
    )


def test_top_lines_fit_a_screen() -> None:
    wide = [
        f"line {number}: {len(line)} characters"
        for number, line in enumerate(readme_lines()[:TOP_LINES], start=1)
        if len(line) > TOP_WIDTH
    ]
    assert not wide, (
        f"README.md: lines over {TOP_WIDTH} characters in the first {TOP_LINES} ({'; '.join(wide)}); "
        "shorten them, or move the full table to docs/benchmarks.md and keep one line per figure"
    )


def test_relative_links_lead_somewhere() -> None:
    broken = []
    for document in [README, *sorted((ROOT / "docs").glob("*.md"))]:
        for inline, reference in LINK.findall(document.read_text(encoding="utf-8")):
            target = inline or reference
            if re.match(r"[a-z]+:", target):  # https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            linked = (document.parent / path).resolve() if path else document
            if not linked.exists():
                broken.append(f"{document.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and linked.suffix == ".md" and anchor not in anchors_of(linked):
                broken.append(f"{document.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, "links to fix: " + "; ".join(broken)


def test_benchmark_tables_live_in_the_docs() -> None:
    benchmarks = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    for heading in ("## Current figures", "## Each CPU family", "## On a GPU"):
        assert heading in benchmarks, f"docs/benchmarks.md lost its section {heading!r}"
