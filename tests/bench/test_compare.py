"""bench.harness.compare: systems alternate run by run, every figure is a median with its
min-max over the runs that finished, ratios are ratios of medians, a failed run is counted and
named, and each run's cgroups (real ones) are removed after it, whatever happened."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench.harness import cgroups
from bench.harness import round_window as rw
from bench.harness.cgroups import RoundGroups
from bench.harness.compare import (
    compare_rows,
    interleaved,
    run_compare,
    run_tag,
    spread,
    summarise,
)


def _rec(e2e: float, peak: float, cpu: float, **more: Any) -> dict[str, Any]:
    return {
        "ok": True,
        "e2e_s": e2e,
        "server_s": e2e / 2,
        "server_peak_bytes": peak * 1.5,
        "server_peak_samples": 100,
        "cgroup": {
            "server": {"peak_bytes": peak, "cpu_s": cpu, "threads_ran": 7, "threads_max": 9},
            "clients": {"peak_bytes": 2e8, "cpu_s": 1.0, "threads_ran": 3, "threads_max": 3},
        },
        **more,
    }


def test_the_systems_alternate_run_by_run() -> None:
    assert interleaved(["FedFaaS", "Flower", "SF"], 2) == [
        (0, "FedFaaS"),
        (0, "Flower"),
        (0, "SF"),
        (1, "FedFaaS"),
        (1, "Flower"),
        (1, "SF"),
    ]
    with pytest.raises(ValueError, match="repeats"):
        interleaved(["FedFaaS"], 0)


def test_a_run_tag_is_letters_and_digits_and_tells_cpu_sets_apart() -> None:
    # a job name takes no '-' or '_' (a tag with one was refused 400 at job creation)
    tags = {
        run_tag(s, cpus, r) for s in (0, 2) for cpus in ("0", "0-1", "0,1", "01") for r in (0, 1)
    }
    assert len(tags) == 16 and all(t.isalnum() for t in tags)
    assert run_tag(0, "0-1", 4) == "x0c0t1r4"


def test_a_spread_is_the_median_and_range_of_the_values_there_are() -> None:
    assert spread([3.0, None, 1.0, 2.0, 10.0]) == {"median": 2.5, "min": 1.0, "max": 10.0, "n": 4}
    assert spread([None, None]) is None


def test_ratios_are_of_medians_and_a_failed_run_is_named_not_averaged() -> None:
    floor = {"bytes": 4e8}
    runs = {
        "FedFaaS": [
            _rec(1.0, 4e8, 0.5, design_floor=floor),
            _rec(2.0, 4.4e8, 1.0, design_floor=floor),
            _rec(9.0, 5e8, 4.0, design_floor=floor),
        ],
        "Flower": [
            _rec(10.0, 2e9, 5.0),
            rw.failure("killed", "over", server_rss_bytes=3e9, client_rss_bytes=1e9),
            _rec(4.0, 1e9, 3.0),
        ],
    }
    s = summarise(runs)
    me, flower = s["systems"]["FedFaaS"], s["systems"]["Flower"]
    assert me["e2e_s"] == {"median": 2.0, "min": 1.0, "max": 9.0, "n": 3}
    assert flower["ok"] == 2 and flower["runs"] == 3
    assert flower["failures"] == ["killed at 3.00 GB"]
    assert flower["e2e_s"]["median"] == 7.0  # of the two that finished
    # the ratio of the medians (7 / 2), not the median of per-run ratios
    assert s["ratios"]["Flower"]["e2e_s"] == pytest.approx(3.5)
    assert s["ratios"]["Flower"]["server_peak_bytes"] == pytest.approx(1.5e9 / 4.4e8)
    assert s["ratios"]["Flower"]["server_cpu_s"] == pytest.approx(4.0 / 1.0)
    assert me["peak_over_floor"]["median"] == pytest.approx(1.1)
    assert me["sample_hz"]["median"] == pytest.approx(50.0)  # 100 samples over 2 s


def test_the_rows_say_the_cpus_the_runs_and_give_medians_ranges_and_ratios() -> None:
    runs = {
        "FedFaaS": [_rec(1.0, 4e8, 0.5, design_floor={"bytes": 4e8}), _rec(3.0, 6e8, 1.5)],
        "Flower": [_rec(8.0, 2e9, 5.0), rw.failure("timeout", "no model")],
    }
    compare = {"order": "interleaved: FedFaaS, Flower, then again", "by_cpus": {}}
    compare["by_cpus"]["0"] = {"runs": runs, "summary": summarise(runs)}
    rows = compare_rows(compare)
    head = rows[0]
    assert "same CPUs 0" in head and "FedFaaS 2/2, Flower 1/2" in head
    assert "failed Flower: timeout" in head and "interleaved" in head
    (e2e,) = [r for r in rows if r.startswith("| round e2e")]
    assert "| 2.00 [1.00-3.00] | Flower 8.00 [8.00-8.00] | 4.00x faster than Flower |" in e2e
    (cpu,) = [r for r in rows if "CPU-seconds" in r]
    assert "| 1.00 [0.50-1.50] |" in cpu and "5.00x less than Flower" in cpu
    (floor,) = [r for r in rows if r.startswith("| FedFaaS design floor")]
    assert "| 0.40 [0.40-0.40]; 1.00 [1.00-1.00] |" in floor
    assert all(r.count("|") == 7 for r in rows), rows


def _spin(groups: RoundGroups, side: str, seconds: float) -> None:
    code = "import time\nend = time.process_time() + float(__import__('sys').argv[1])\n"
    code += "while time.process_time() < end:\n    pass\n"
    with getattr(groups, side).spawning():
        p = subprocess.Popen([sys.executable, "-c", code, str(seconds)])
    assert p.wait(60) == 0


def _leftover_groups() -> list[Path]:
    return cgroups.groups_named(f"fedfaas-bench-{os.getpid()}-")


@pytest.mark.skipif(cgroups.unavailable() is not None, reason=str(cgroups.unavailable()))
def test_every_run_has_fresh_groups_on_the_cpus_asked_and_none_is_left() -> None:
    calls: list[tuple[str, str, str]] = []

    def runner(name: str) -> Any:
        def run(groups: RoundGroups, tag: str) -> dict[str, Any]:
            calls.append((name, tag, groups.server.cpus))
            assert groups.server.pids() == [] and groups.clients.pids() == []
            groups.open_window()
            _spin(groups, "server", 0.1)
            _spin(groups, "clients", 0.02)
            acct = groups.close_window()
            if name == "B" and len(calls) == 4:
                raise RuntimeError("the system under test broke")
            return {"ok": True, "e2e_s": 1.0, "cgroup": acct}

        return run

    seen: list[int] = []

    def after_run(so_far: dict[str, Any]) -> None:
        runs = so_far["by_cpus"]["0"]["runs"]
        seen.append(sum(len(r) for r in runs.values()))
        assert so_far["by_cpus"]["0"]["summary"]["systems"]["A"]["runs"] == len(runs["A"])

    out = run_compare(
        {"A": runner("A"), "B": runner("B")}, cpus_sets=["0"], repeats=2, after_run=after_run
    )
    assert seen == [1, 2, 3, 4]  # told after every run
    assert [(n, c) for n, _, c in calls] == [("A", "0"), ("B", "0")] * 2
    assert len({t for _, t, _ in calls}) == 4  # a tag of its own for every run
    runs = out["by_cpus"]["0"]["runs"]
    assert runs["B"][1]["ok"] is False and "broke" in runs["B"][1]["detail"]
    assert [r["repeat"] for r in runs["A"]] == [0, 1]
    for rec in [*runs["A"], runs["B"][0]]:
        server = rec["cgroup"]["server"]
        assert server["cpus"] == "0" and server["cpu_s"] > 0.05
        assert rec["cgroup"]["clients"]["cpu_s"] < server["cpu_s"]
    assert not _leftover_groups()


@pytest.mark.skipif(cgroups.unavailable() is not None, reason=str(cgroups.unavailable()))
def test_a_group_that_cannot_be_removed_is_named_in_its_runs_record() -> None:
    held: list[Path] = []

    def run(groups: RoundGroups, tag: str) -> dict[str, Any]:
        sub = groups.server.dirs["memory"] / "held"  # a child group: its parent stays busy
        sub.mkdir()
        held.append(sub)
        return {"ok": True, "e2e_s": 1.0}

    try:
        out = run_compare({"A": run}, cpus_sets=["0"], repeats=1, close_timeout=0.2)
        (rec,) = out["by_cpus"]["0"]["runs"]["A"]
        assert rec["ok"] and "could not remove" in rec["cgroup_left"]
        assert str(held[0].parent) in rec["cgroup_left"]
    finally:
        for sub in held:
            sub.rmdir()
            sub.parent.rmdir()
    assert not _leftover_groups()
