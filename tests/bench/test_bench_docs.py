"""The benchmark sentences of README.md and docs/ against the code and the stored JSON (issue 37:
"the README's benchmark sentences match the JSON; a test reads both").

- ``make bench`` regenerates every file of ``bench/results/``: each stored JSON is written by a
  module that ``make bench``'s recipe runs;
- every sentence that names ``make bench-X`` (or ``make test-faults`` / ``make soak``) and a
  ``bench/results/Y`` file: the target runs the module that writes Y; where ``Y``'s JSON has a
  run record, its command is that module's;
- the figures the pages quote about a benchmark's set-up (client counts, repeats, poisoned
  updates) are the code's, and no page quotes a measured figure (those live in
  ``bench/results/*.md``, rendered from the JSON).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from bench import dataplane, robust, scale
from bench.harness.compare import REPEATS
from tests.test_makefile import dry_run, recipe_problem

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results"
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _modules(target: str) -> list[str]:
    """The ``bench.X`` modules ``make -n target`` runs, in order (``make bench``'s loop over
    the benchmarks included)."""
    res = dry_run(target)
    assert recipe_problem(res) is None, res
    out = []
    for line in res.stdout.splitlines():
        loop = re.search(r"for b in ([\w ]+); do .*-m bench\.\$b", line)
        out += loop.group(1).split() if loop else re.findall(r"-m bench\.(\w+)", line)
    return out


def _writes(module: str) -> set[str]:
    """The result names ``bench/<module>.py`` writes (``write_result(x, "name", ...)``)."""
    src = (ROOT / "bench" / f"{module}.py").read_text()
    return set(re.findall(r"write_result\(\s*[^,]+,\s*\"(\w+)\"", src))


def test_make_bench_writes_every_stored_result() -> None:
    written = {name for m in _modules("bench") for name in _writes(m)}
    stored = {p.stem for p in RESULTS.glob("*.json")}
    assert stored, "no stored results"
    assert stored <= written, f"make bench writes none of {sorted(stored - written)}"
    # the robust rows it writes by default are median's and Krum's
    assert robust.DEFAULT_RULES == ",".join(robust.PEERS) == "median,krum"


def _sentences() -> list[tuple[str, str, str]]:
    """(page, make target, results name) for every paragraph or table row of the pages that
    names one ``make`` target and ``bench/results/<name>.<ext>`` files."""
    found = []
    for page in PAGES:
        for block in re.split(r"\n\s*\n|\n(?=\|)", page.read_text()):
            targets = set(re.findall(r"`make ((?:bench-|test-faults|soak)[\w-]*)`", block))
            names = set(re.findall(r"bench/results/(\w+)\.", block))
            if len(targets) == 1 and names:
                found += [(page.name, next(iter(targets)), n) for n in sorted(names)]
    return found


SENTENCES = _sentences()


def test_the_pages_name_benchmark_results() -> None:
    targets = {t for _, t, _ in SENTENCES}
    assert {"bench-scale", "bench-robust", "bench-flower_baseline", "soak"} <= targets


@pytest.mark.parametrize(("page", "target", "name"), SENTENCES)
def test_a_sentence_names_the_target_that_writes_its_result(
    page: str, target: str, name: str
) -> None:
    [module] = _modules(target)
    assert name in _writes(module), f"{page}: `make {target}` does not write {name}"
    stored = RESULTS / f"{name}.json"
    if stored.exists():
        run = json.loads(stored.read_text()).get("run") or {}
        if run.get("command"):
            assert run["command"].split()[:3] == ["python", "-m", f"bench.{module}"], run


def _text() -> str:
    return "\n".join(p.read_text() for p in PAGES)


def test_the_set_up_the_pages_quote_is_the_codes() -> None:
    text = " ".join(_text().split())
    lo, hi = min(scale.CLIENTS), max(scale.CLIENTS)
    assert f"`make bench-scale` ({lo} to {hi} clients)" in text
    assert f"against the number of clients ({lo} to {hi}, ResNet-18)" in text
    assert f"{REPEATS} runs each alternating" in text
    assert "memory sweep" not in text  # bench.scale's clients axis is the sweep
    assert f"variants (userspace router, lean settings, one core), {REPEATS} runs" in text
    assert set(dataplane.variants(Path("/w"), [], 2, ebpf=True, rnd={})) == {
        dataplane.DEFAULT,
        dataplane.USERSPACE,
        dataplane.LEAN,
        dataplane.ONE_CORE_ROUND,
    }
    bad = len(robust.BAD_FLIP + robust.BAD_SCALE)
    assert f"median and Krum over {robust.N} ResNet-18 updates, {bad} poisoned" in text
    assert f"median and Krum over {robust.N} poisoned ResNet-18" in text


def test_no_page_quotes_a_measured_figure() -> None:
    """Measured figures drift with the machine and the commit; they live in bench/results."""
    measured = re.compile(
        r"\d+(?:\.\d+)?\s*x\s+(?:faster|less|below)\b"
        r"|\b\d+\.\d+\s*(?:GB|GiB)\b|\b\d+(?:\.\d+)?\s*(?:MB/s|GB/s)\b"
        r"|\b\d+(?:\.\d+)?\s*(?:ms|s)\s+(?:against|vs\.?|versus)\b",
        flags=re.I,
    )
    hits = [
        (p.name, m.group(0))
        for p in PAGES
        for m in measured.finditer(p.read_text())
        if "bench" in p.read_text()[max(0, m.start() - 400) : m.end() + 400]
    ]
    assert not hits, hits
