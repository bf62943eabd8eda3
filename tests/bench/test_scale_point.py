"""bench.scale's point on real rounds: FedFaaS, both Flowers and SF each run with their server side
in a cgroup pinned to the CPUs asked and their clients in another, alternating; the point
reports each system's cgroup peak and CPU-seconds and FedFaaS's design floor, its table row
is the medians, and no group is left behind."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench import scale, scale_report
from bench.harness import cgroups

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.skipif(cgroups.unavailable() is not None, reason=str(cgroups.unavailable())),
]


@pytest.fixture
def work() -> Iterator[Path]:
    """A short folder: the gateway's router socket lives under it (AF_UNIX paths are short)."""
    path = Path(tempfile.mkdtemp(prefix="fb-sc-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def test_every_system_of_a_point_is_measured_by_cgroup(work: Path) -> None:
    point = {"axis": "clients", "clients": 2, "update_bytes": 1_000_000}
    seen: list[int] = []
    # no memory guard (limit 0, floor 0): this test is about the cgroups, and the machine's
    # available memory is other work's to move
    out = scale.run_point(
        work, point, ebpf=False, limit=0, floor=0, timeout=300, cpus="0", repeats=1,
        after_run=lambda now: seen.append(sum(map(len, now["compare"]["by_cpus"]["0"]["runs"].values()))),
    )  # fmt: skip
    n = len(scale.SYSTEMS)
    assert seen == [*range(1, n + 1), n]  # written after every run, and once at the end
    runs = out["compare"]["by_cpus"]["0"]["runs"]
    assert [r["repeat"] for r in runs["FedFaaS"]] == [0]
    for system in scale.SYSTEMS:
        [rec] = runs[system]
        assert rec["ok"], (system, rec)
        server = rec["cgroup"]["server"]
        assert server["cpus"] == "0" and server["cpu_s"] > 0 and server["peak_bytes"] > 0
    assert runs["FedFaaS"][0]["design_floor"]["bytes"] > 0
    res = {
        "run": {"command": "python -m bench.scale", "commit": {"sha": "abc"}},
        "config": {
            "threads": {"requested": 1},
            "server_mem_limit_bytes": 0,
            "floor_bytes": 0,
            "timeout_s": 300.0,
            "server_cpus": "0",
            "repeats": 1,
            "systems": list(scale.SYSTEMS),
            "router_probe": {"mode": "userspace", "reason": "test"},
        },
        "points": [out],
    }
    md = scale_report.render(res)
    row = next(ln for ln in md.splitlines() if ln.startswith("| 2 | 1.0 | FedFaaS |"))
    peak = runs["FedFaaS"][0]["cgroup"]["server"]["peak_bytes"] / 1e9
    assert f"| {peak:.2f} [{peak:.2f}-{peak:.2f}] |" in row
    assert not cgroups.groups_named(f"fedfaas-bench-{os.getpid()}-")
