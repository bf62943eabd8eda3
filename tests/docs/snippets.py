"""The README's and docs/'s code snippets, read by name.

Every fenced code block of README.md, docs/*.md and the components' READMEs (``bpf/``,
``cache_engine/``, ``flstore_workloads/``, ``runtime/``, ``charts/fedfaas/``, ``deploy/faasd/``)
follows a line ``<!-- snippet: NAME -->``
(an HTML comment: the rendered page does not show it). Tests ask for a snippet by its name, so
a test fails when the text it runs changes or goes away, and
``tests/docs/test_docs.py::test_every_snippet_is_named_and_run_by_a_test`` fails when a block
has no name or no test names it.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TESTS = Path(__file__).resolve().parent
NAME = re.compile(r"<!-- snippet: ([\w-]+) -->")
FENCE = re.compile(r"^```(\w*)\s*$")


@dataclass(frozen=True)
class Snippet:
    """One fenced code block: where it is, its name, its language and its text."""

    page: Path
    line: int
    name: str | None
    lang: str
    text: str


def pages() -> list[Path]:
    """README.md, every page of docs/ (the SDK's Sphinx sources under docs/api aside) and every
    README.md of a folder of the repository (the components', the chart's, faasd's)."""
    tracked = subprocess.run(
        ["git", "ls-files", "*/README.md"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split()
    components = sorted(REPO / t for t in tracked if not t.startswith("docs/"))
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), *components]


def read(page: Path) -> list[Snippet]:
    """The fenced blocks of ``page``, each with the name on the line before it (or None)."""
    lines = page.read_text().splitlines()
    found: list[Snippet] = []
    i = 0
    while i < len(lines):
        fence = FENCE.match(lines[i])
        if not fence:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        named = NAME.fullmatch(lines[i - 1].strip()) if i else None
        text = "\n".join(lines[i + 1 : end]) + "\n"
        found.append(Snippet(page, i + 1, named.group(1) if named else None, fence.group(1), text))
        i = end + 1
    return found


def all_snippets() -> list[Snippet]:
    """Every fenced block of every page."""
    return [s for page in pages() for s in read(page)]


def snippet(name: str) -> Snippet:
    """The block named ``name`` (exactly one must exist)."""
    hits = [s for s in all_snippets() if s.name == name]
    assert len(hits) == 1, f"snippet {name!r}: {len(hits)} blocks carry that name"
    return hits[0]


def command_lines(text: str) -> list[str]:
    """A shell snippet's commands: one per line (``\\``-continued lines joined), comments
    after `` # `` dropped, heredoc bodies left out."""
    out: list[str] = []
    heredoc: str | None = None
    pending = ""
    for raw in text.splitlines():
        if heredoc is not None:
            if raw.strip() == heredoc:
                heredoc = None
            continue
        line = pending + (raw.lstrip() if pending else raw)
        if line.rstrip().endswith("\\"):
            pending = line.rstrip()[:-1].rstrip() + " "
            continue
        pending = ""
        line = re.split(r"\s+#\s", line, maxsplit=1)[0].strip()
        if line:
            out.append(line)
        marker = re.search(r"<<'(\w+)'", line)
        if marker:
            heredoc = marker.group(1)
    return out


def heredoc(text: str, marker: str = "EOF") -> str:
    """The body of the snippet's ``<<'EOF'`` heredoc."""
    body = re.search(rf"<<'{marker}'\n(.*?)\n{marker}\n", text, re.S)
    assert body, "no heredoc in the snippet"
    return body.group(1) + "\n"
