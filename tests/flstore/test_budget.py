"""The node's memory budget: what counts against it, and where it comes from (pure)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cache_engine.budget import MemoryBudget, OverBudget
from cache_engine.node_memory import node_memory


def test_loads_are_reserved_before_they_start_and_never_pass_the_budget() -> None:
    b = MemoryBudget(1000, keep=200)
    b.report("f0", 300)
    b.lease([("offer:t:c1", 100)])
    assert b.used() == 400 and b.room() == 400  # 1000 - 200 kept for queries - 400 used
    b.reserve(350)
    with pytest.raises(OverBudget, match="200 kept"):
        b.reserve(100)  # 750 + 100 > 800
    b.unreserve(350)
    b.reserve(400)
    b.unreserve(400)
    b.unlease(["offer:t:c1"])
    b.forget_function("f0")
    assert b.used() == 0 and b.describe()["limit_bytes"] == 1000


def test_the_default_is_the_nodes_memory_or_its_cgroup_limit_where_lower(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24000000 kB\nMemFree:  1 kB\n")
    cgroup = tmp_path / "memory.max"
    cgroup.write_text("max\n")
    assert node_memory(meminfo, cgroup) == 24_000_000 * 1024
    cgroup.write_text("8589934592\n")
    assert node_memory(meminfo, cgroup) == 8589934592
    assert node_memory(meminfo, tmp_path / "none") == 24_000_000 * 1024
