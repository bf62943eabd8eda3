"""Which commit each stored result came from, and whether they all came from one landed commit.

Issue 37: every file under ``bench/results/`` is regenerated on one landed commit with a clean
tree. ``make bench`` takes many hours on this machine, so it runs in parts
(``docs/benchmarks.md``, "Budget"), each part a separate ``make`` run; this module checks, after
the last part, that the parts agree: every ``bench/results/*.json`` has a ``run`` record
(:func:`bench.runinfo.run_info`) whose commit is the same, whose tree was clean, and which is
in this checkout's history (landed, not a commit of a tree since thrown away).

Usage: ``python -m bench.results_state [--results DIR]`` prints a table (result, commit, clean,
started, command) and what is wrong; exits 1 when anything is, 0 when every result names the
same landed commit with a clean tree.
"""

from __future__ import annotations

import argparse
import json
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.runinfo import ROOT

RESULTS = Path(__file__).resolve().parent / "results"


@dataclass(frozen=True)
class ResultCommit:
    """One stored result's provenance, as its ``run`` record says (None: not said)."""

    name: str
    sha: str | None
    dirty: bool | None
    started: str | None
    command: str | None


def read_commits(results: Path) -> list[ResultCommit]:
    """Every ``*.json`` of ``results`` (sorted by name) with its run record's commit. A file
    without a ``run`` record, or not JSON, has ``sha`` None."""
    out = []
    for path in sorted(results.glob("*.json")):
        try:
            run = json.loads(path.read_text()).get("run") or {}
        except (ValueError, AttributeError):
            run = {}
        commit = run.get("commit") or {}
        out.append(
            ResultCommit(
                name=path.stem,
                sha=commit.get("sha") if isinstance(commit, dict) else None,
                dirty=commit.get("dirty") if isinstance(commit, dict) else None,
                started=run.get("started") or run.get("time"),
                command=run.get("command"),
            )
        )
    return out


def landed(sha: str, repo: Path = ROOT) -> bool:
    """Whether commit ``sha`` is in the history of ``repo``'s HEAD (False for a commit git
    does not know: a tree since rewritten or never committed)."""
    res = subprocess.run(
        ["git", "-C", str(repo), "merge-base", "--is-ancestor", sha, "HEAD"],
        capture_output=True,
        check=False,
    )
    return res.returncode == 0


def problems(rows: Sequence[ResultCommit], is_landed: Callable[[str], bool]) -> list[str]:
    """What keeps ``rows`` from being one landed commit's clean results, one line each (empty:
    nothing). ``is_landed``: whether a commit is in the history (:func:`landed`)."""
    if not rows:
        return ["no stored results"]
    out = []
    for r in rows:
        if r.sha is None:
            out.append(f"{r.name}: no run record with a commit")
        elif r.dirty is not False:
            what = "an uncommitted tree" if r.dirty else "a tree of unknown state"
            out.append(f"{r.name}: from {what} at {r.sha[:9]}")
    shas = sorted({r.sha for r in rows if r.sha})
    out += [f"commit {s[:9]} is not in this history" for s in shas if not is_landed(s)]
    if len(shas) > 1:
        by = {s: [r.name for r in rows if r.sha == s] for s in shas}
        out.append(
            f"{len(shas)} commits: "
            + "; ".join(f"{s[:9]} ({', '.join(names)})" for s, names in by.items())
        )
    return out


def render(rows: Sequence[ResultCommit], found: Sequence[str]) -> str:
    """The table of ``rows`` and the verdict (``found``: :func:`problems`)."""
    lines = [
        "| result | commit | clean tree | started | command |",
        "| --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        clean = "?" if r.sha is None or r.dirty is None else ("no" if r.dirty else "yes")
        lines.append(
            f"| {r.name} | {(r.sha or 'none')[:9]} | {clean} | {r.started or '?'} | "
            f"`{r.command or '?'}` |"
        )
    lines.append("")
    if found:
        lines += ["Not one landed commit's clean results:", *(f"- {p}" for p in found)]
    else:
        lines.append(f"Every result from commit {rows[0].sha}, a clean tree, in this history.")
    return "\n".join(lines)


def state(results: Path = RESULTS) -> dict[str, Any]:
    """``{"rows", "problems"}`` for ``results`` against this checkout's history."""
    rows = read_commits(results)
    return {"rows": rows, "problems": problems(rows, landed)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.results_state", description=__doc__)
    ap.add_argument("--results", type=Path, default=RESULTS, help="results folder")
    args = ap.parse_args(argv)
    got = state(args.results)
    print(render(got["rows"], got["problems"]))
    return 1 if got["problems"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
