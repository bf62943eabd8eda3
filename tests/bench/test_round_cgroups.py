"""bench.dataplane's same-CPUs comparison on real rounds (--quick --compare-only): FedFaaS's,
Flower's and SF's rounds each run with their server side in a cgroup pinned to CPU 0 and
their clients in another, report each group's peak, CPU-seconds and threads, FedFaaS its
design floor; the table is rendered from the JSON, and no group is left behind."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from bench import dataplane
from bench.harness import cgroups

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.timeout(900),
    pytest.mark.skipif(cgroups.unavailable() is not None, reason=str(cgroups.unavailable())),
]


def _leftover_groups() -> list[Path]:
    return cgroups.groups_named(f"fedfaas-bench-{os.getpid()}-")


def test_every_system_is_measured_by_cgroup_on_the_same_cpus(tmp_path: Path) -> None:
    # the default CPU sets: CPU 0, then every CPU (once, on a one-CPU machine)
    argv = ["--quick", "--compare-only", "--repeats", "1", "--out", str(tmp_path)]
    assert dataplane.main(argv) == 0
    res = json.loads((tmp_path / "dataplane.json").read_text())
    every = ",".join(str(c) for c in sorted(os.sched_getaffinity(0)))
    assert list(res["compare"]["by_cpus"]) == list(dict.fromkeys(["0", every]))
    block = res["compare"]["by_cpus"]["0"]
    assert list(block["runs"]) == ["FedFaaS", "Flower", "SF"]
    for system, (rec,) in block["runs"].items():
        assert rec["ok"], (system, rec)
        server, clients = rec["cgroup"]["server"], rec["cgroup"]["clients"]
        assert server["cpus"] == "0", system
        # the clients on the other CPUs: no system's clients take its server's CPU time
        rest = sorted(os.sched_getaffinity(0) - {0}) or [0]
        assert cgroups.parse_cpus(clients["cpus"]) == rest, system
        assert server["peak_bytes"] >= server["idle_bytes"] > 0, system
        assert server["cpu_s"] > 0 and clients["cpu_s"] > 0, system
        assert server["threads_ran"] >= 1 and server["thread_samples"] >= 2, system
        # every client serialised its 4 MB update in the clients' group
        assert clients["peak_bytes"] > 4 * 4_000_000, system
    fedfaas = block["runs"]["FedFaaS"][0]
    # gateway, replica and Redis were born in the server group: their threads ran there
    assert fedfaas["cgroup"]["server"]["threads_max"] >= 3
    floor = fedfaas["design_floor"]
    assert floor["idle_processes"] == fedfaas["server_baseline_bytes"] > 0
    assert floor["bytes"] > floor["idle_processes"]
    for system, (rec,) in res["compare"]["by_cpus"][every]["runs"].items():
        assert rec["ok"], (system, rec)  # its runs' longer tags name folders that work too
        got = rec["cgroup"]["server"]["cpus"]  # as the kernel writes it: 0-1 for 0,1
        assert cgroups.parse_cpus(got) == cgroups.parse_cpus(every)
    summary = block["summary"]
    assert summary["ratios"]["Flower"]["server_cpu_s"] > 0
    md = (tmp_path / "dataplane.md").read_text()
    assert "same CPUs 0" in md and "FedFaaS design floor" in md and "CPU-seconds" in md
    assert not _leftover_groups()
