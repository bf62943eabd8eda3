"""bench.scale's point on real rounds: FedFaaS and Flower each run with their server side in
a cgroup pinned to the CPUs asked and their clients in another; the point reports each side's
cgroup peak and CPU-seconds, and no group is left behind."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench import scale
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


def test_both_sides_of_a_point_are_measured_by_cgroup(work: Path) -> None:
    point = {"axis": "clients", "clients": 2, "update_bytes": 1_000_000}
    # no memory guard (limit 0, floor 0): this test is about the cgroups, and the machine's
    # available memory is other work's to move
    out = scale.run_point(work, point, ebpf=False, limit=0, floor=0, timeout=300, cpus="0")
    for side in ("fedfaas", "flower"):
        rec = out[side]
        assert rec["ok"], (side, rec)
        server = rec["cgroup"]["server"]
        assert server["cpus"] == "0" and server["cpu_s"] > 0 and server["peak_bytes"] > 0
    md = scale.render(
        {
            "run": {"command": "python -m bench.scale", "commit": {"sha": "abc"}},
            "config": {
                "threads": {"requested": 1},
                "server_mem_limit_bytes": 0,
                "floor_bytes": 0,
                "timeout_s": 300.0,
                "server_cpus": "0",
                "router_probe": {"mode": "userspace", "reason": "test"},
            },
            "points": [out],
        }
    )
    row = next(ln for ln in md.splitlines() if ln.startswith("| 2 | 1.0 |"))
    peak = out["fedfaas"]["cgroup"]["server"]["peak_bytes"] / 1e9
    assert f"| {peak:.2f} |" in row
    assert not cgroups.groups_named(f"fedfaas-bench-{os.getpid()}-")
