"""bench.dataplane's whole run at a smoke size (--quick, Flower left out, one repeat): the
comparison, the micro-benchmarks and FedFaaS's round variants, each variant run as the systems
are (fresh cgroups, measured alike), the table and plot rendered from the JSON, no group left."""

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


def test_the_round_variants_are_repeated_comparisons_measured_by_cgroup(tmp_path: Path) -> None:
    """The comparison on the CPUs the variants run on (all of them), as ``make bench-dataplane``
    does. Regression: the default variant's runs had the comparison's FedFaaS runs' tags and
    folders, and every one failed (``FileExistsError``; its row said 0/5)."""
    every_cpu = ",".join(str(c) for c in sorted(os.sched_getaffinity(0)))
    argv = ["--quick", "--skip-flower", "--repeats", "2", "--cpus", every_cpu]
    assert dataplane.main([*argv, "--out", str(tmp_path)]) == 0
    res = json.loads((tmp_path / "dataplane.json").read_text())
    assert list(res["compare"]["by_cpus"]) == [every_cpu]
    variants = res["variants"]
    [(cpus, block)] = variants["by_cpus"].items()
    ebpf = res["router_probe"]["mode"] == "ebpf"
    names = [dataplane.DEFAULT, *([dataplane.USERSPACE] if ebpf else []), dataplane.LEAN,
             dataplane.ONE_CORE_ROUND]  # fmt: skip
    assert list(block["runs"]) == names
    for name, recs in block["runs"].items():
        assert [r["repeat"] for r in recs] == [0, 1], name
        for rec in recs:
            assert rec["ok"], (name, rec)
            assert (
                rec["cgroup"]["server"]["cpu_s"] > 0 and rec["cgroup"]["server"]["peak_bytes"] > 0
            )
    lean = block["runs"][dataplane.LEAN][0]
    assert (lean["fanout"], lean["max_inflight"]) == (4, 1)
    md = (tmp_path / "dataplane.md").read_text()
    assert f"Round variants, FedFaaS alone, on CPUs {cpus}: 2 runs each" in md
    assert "| ingest " in md and "| FedAvg fold, 1 core" in md
    assert (tmp_path / "dataplane.png").stat().st_size > 0
    assert not cgroups.groups_named(f"fedfaas-bench-{os.getpid()}-")
