"""bench.dataplane's end-to-end round on real components (gateway, aggregator replicas, Redis,
SDK clients), at a smoke size: it measures both windows and the summed peak, and a round the
memory guard stops is a 'killed' record, with nothing left in /dev/shm."""

from __future__ import annotations

import glob
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.harness import round_clients as rc
from bench.harness.fedfaas_round import bench_round_e2e

pytestmark = pytest.mark.integration

LAYOUT = rc.scaled_layout(rc.resnet18_layout(), 1_000_000)


@pytest.fixture
def work() -> Iterator[Path]:
    """A short folder: the gateway's router socket lives under it (AF_UNIX paths are short)."""
    path = Path(tempfile.mkdtemp(prefix="fb-e2e-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _leftovers() -> list[str]:
    return glob.glob(f"/dev/shm/fedfaas-bench-*{os.getpid()}-*")


@pytest.mark.parametrize("upload", ["stream", "bytes"])
def test_a_round_through_the_sdk_reports_both_windows_and_the_summed_peak(
    work: Path, upload: str
) -> None:
    r = bench_round_e2e(work, LAYOUT, 2, ebpf=False, timeout=120, upload=upload)
    assert r["ok"], r
    assert r["clients"] == 2 and r["update_bytes"] == 1_000_000 and r["router"] == "userspace"
    # the server window opens after the clients' marks: it leaves their serialisation out
    # measured (not None); 0 when the round ends within the poll's lag (round_window.server_window_s)
    assert r["server_s"] is not None and 0 <= r["server_s"] <= r["e2e_s"]
    assert 0 < r["server_gateway_mark_s"] <= r["e2e_s"] and r["upload"] == upload
    # a streamed upload serialises nothing before its send; bytes are made first
    assert r["encode_s_max"] == 0 if upload == "stream" else r["encode_s_max"] > 0
    # gateway, one replica, Redis: each one's VmHWM (reset as the window opened) in the sum
    assert r["server_processes"] >= 3
    # (a process may give a little back between the idle reading and the reset)
    assert r["server_hwm_bytes"] >= 0.9 * r["server_idle_rss_bytes"] > 0
    assert r["router_frames"] > 0  # the replicas aggregated it through the router
    assert not _leftovers()


def test_a_round_the_guard_stops_is_a_killed_record(work: Path) -> None:
    r = bench_round_e2e(work, LAYOUT, 2, ebpf=False, mem_limit_bytes=1, timeout=120)
    assert r["ok"] is False and r["failure"] == "killed", r
    assert "over the limit" in r["detail"] and r["server_rss_bytes"] > 1
    assert r["clients"] == 2 and r["update_bytes"] == 1_000_000
    assert not _leftovers()
