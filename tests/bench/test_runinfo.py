"""bench.runinfo: the thread pinning reports the counts it set, the run block's fields."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from bench import runinfo
from bench.runinfo import (
    THREAD_ENV,
    max_pool_threads,
    pinned_threads,
    run_header,
    run_info,
    thread_counts,
    write_result,
)


@pytest.mark.parametrize("n", [1, 2])
def test_pinned_threads_limits_every_loaded_blas_pool_and_reports_it(n: int) -> None:
    with pinned_threads(n) as pinned:
        assert pinned["requested"] == n
        assert pinned["env"] == dict.fromkeys(THREAD_ENV, str(n))
        # numpy's and scipy's BLAS are loaded by pinned_threads itself, so there is one at least
        blas = [p for p in pinned["pools"] if p["api"] == "blas"]
        assert blas, pinned
        assert all(p["threads"] == n for p in pinned["pools"]), pinned
        assert all(p["threads"] == n for p in thread_counts())


@pytest.mark.integration
def test_pinned_threads_hands_the_count_to_child_processes_and_restores_the_environment() -> None:
    before = {k: os.environ.get(k) for k in THREAD_ENV}
    probe = (
        "import numpy, json; from bench.runinfo import thread_counts; "
        "print(json.dumps([p['threads'] for p in thread_counts()]))"
    )
    with pinned_threads(1):
        out = subprocess.run(
            [sys.executable, "-c", probe], capture_output=True, text=True, check=True
        ).stdout
    assert set(json.loads(out)) == {1}, out
    assert {k: os.environ.get(k) for k in THREAD_ENV} == before


def test_pinned_threads_refuses_zero() -> None:
    with pytest.raises(ValueError, match="n >= 1"), pinned_threads(0):
        pass


def test_run_info_records_commit_times_machine_command_and_threads() -> None:
    run = run_info("bench.example", ["--quick", "a b"])
    assert run["command"] == "python -m bench.example --quick 'a b'"
    assert run["argv"] == list(sys.orig_argv)
    assert len(run["commit"]["sha"]) == 40 and isinstance(run["commit"]["dirty"], bool)
    started = datetime.fromisoformat(run["started"])
    assert started.utcoffset() == timedelta(0)
    assert abs((datetime.now(UTC) - started).total_seconds()) < 60
    assert run["finished"] is None
    m = run["machine"]
    assert m["cores"] == os.cpu_count() and 1 <= m["usable_cores"] <= m["cores"]
    assert m["memory_bytes"] > 0 and m["cpu"] and m["kernel"] == os.uname().release
    assert set(run["threads"]["env"]) == set(THREAD_ENV)
    with pinned_threads(1):
        pinned = run_info("bench.example", [])
    assert pinned["threads"]["env"] == dict.fromkeys(THREAD_ENV, "1")
    assert pinned["threads"]["pools"] and all(p["threads"] == 1 for p in pinned["threads"]["pools"])


def test_write_result_renders_the_markdown_from_the_json_as_written(tmp_path: Path) -> None:
    seen: list[dict[str, Any]] = []

    def render(r: dict[str, Any]) -> str:
        seen.append(r)
        return f"# x\n\n{run_header(r['run'])}\n\n| n | {r['rows'][0]} |\n"

    result = {"run": run_info("bench.example", []), "rows": [(1, 2.5)], "by": {3: "three"}}
    stored, md = write_result(result, "example", render, tmp_path)
    # the renderer got the JSON as read back: tuples are lists, int keys are strings
    assert seen == [stored] and stored == json.loads((tmp_path / "example.json").read_text())
    assert stored["rows"] == [[1, 2.5]] and stored["by"] == {"3": "three"}
    assert (tmp_path / "example.md").read_text() == md
    assert "| n | [1, 2.5] |" in md
    finished = datetime.fromisoformat(stored["run"]["finished"])
    assert finished >= datetime.fromisoformat(stored["run"]["started"])
    assert stored["run"]["commit"]["sha"][:12] in md and "python -m bench.example" in md
    assert f"{os.cpu_count()} cores" in md and stored["run"]["finished"] in md


def test_max_pool_threads_is_the_pinned_count_inside_the_block() -> None:
    with pinned_threads(1):
        assert max_pool_threads() == 1
    with pinned_threads(2):
        assert max_pool_threads() == 2


def test_a_rewritten_result_file_does_not_make_the_tree_dirty(tmp_path: Path) -> None:
    """``make bench`` writes bench/results/ between benchmarks: only code changes are dirt."""
    repo = tmp_path / "repo"
    (repo / "bench" / "results").mkdir(parents=True)
    (repo / "bench" / "results" / "x.json").write_text("{}")
    (repo / "code.py").write_text("a = 1\n")

    def git(*args: str) -> None:
        subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True)

    git("init", "-q")
    git("-c", "user.name=t", "-c", "user.email=t@t", "add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x")
    old = runinfo.ROOT
    try:
        runinfo.ROOT = repo
        (repo / "bench" / "results" / "x.json").write_text('{"new": 1}')
        assert runinfo.commit()["dirty"] is False
        (repo / "code.py").write_text("a = 2\n")
        assert runinfo.commit()["dirty"] is True
    finally:
        runinfo.ROOT = old


def test_rerender_rewrites_the_md_and_plot_from_the_stored_json(tmp_path: Path) -> None:
    (tmp_path / "x.json").write_text(json.dumps({"figure": 1.5}))
    plotted: list[Path] = []

    def plot(result: dict[str, Any], path: Path) -> None:
        plotted.append(path)
        path.write_bytes(b"png")

    md = runinfo.rerender("x", lambda r: f"figure {r['figure']}\n", plot, tmp_path)
    assert md == "figure 1.5\n" == (tmp_path / "x.md").read_text()
    assert plotted == [tmp_path / "x.png"]


def _benchmark_child(teardown: str) -> subprocess.Popen[bytes]:
    """A process that calls ``stop_on_sigterm`` and sleeps in a ``try`` whose ``finally`` is
    ``teardown`` (Python lines, indented 4), started and ready for its SIGTERM."""
    code = (
        "import time\n"
        "from bench.runinfo import stop_on_sigterm\n"
        "stop_on_sigterm()\n"
        "try:\n"
        "    print('ready', flush=True)\n"
        "    time.sleep(60)\n"
        f"finally:\n{teardown}"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, cwd=Path(__file__).parents[2]
    )
    assert child.stdout is not None and child.stdout.readline() == b"ready\n"
    return child


def test_a_sigterm_runs_the_finally_blocks_that_take_a_benchmark_down(tmp_path: Path) -> None:
    """Python's default SIGTERM ends a process without its ``finally`` blocks: a benchmark cut
    short by ``timeout`` left its servers, cgroups and /dev/shm files behind."""
    marker = tmp_path / "cleaned"
    child = _benchmark_child(f"    open({str(marker)!r}, 'w').write('yes')\n")
    child.terminate()
    assert child.wait(30) == 143
    assert marker.read_text() == "yes"


def test_a_second_sigterm_does_not_cut_the_teardown_short(tmp_path: Path) -> None:
    """``pkill -f`` matches ``timeout`` and the benchmark under it, which then gets SIGTERM
    twice: the second, during the teardown the first started, must not end it (a cut-short
    teardown left a fault campaign's platform running)."""
    tearing, marker = tmp_path / "tearing", tmp_path / "cleaned"
    child = _benchmark_child(
        f"    open({str(tearing)!r}, 'w').close()\n"
        "    time.sleep(1.0)\n"
        f"    open({str(marker)!r}, 'w').write('yes')\n"
    )
    child.terminate()
    deadline = time.monotonic() + 30
    while not tearing.exists():
        assert time.monotonic() < deadline and child.poll() is None
        time.sleep(0.01)
    child.terminate()  # the second, mid-teardown
    assert child.wait(30) == 143
    assert marker.read_text() == "yes"


def test_a_process_that_handles_sigterm_already_keeps_its_own_handler() -> None:
    """The test suite runs benchmarks' ``main`` in its process and stops the whole run on a
    SIGTERM (tests/conftest.py): a benchmark does not swap that for its ``SystemExit``."""
    import signal

    def own(signum: int, frame: object) -> None:
        pass

    previous = signal.signal(signal.SIGTERM, own)
    try:
        runinfo.stop_on_sigterm()
        assert signal.getsignal(signal.SIGTERM) is own
    finally:
        signal.signal(signal.SIGTERM, previous)
