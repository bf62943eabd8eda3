"""bench.harness.round_window's memory measure: a shared-memory page is counted once, however
many server processes map it (the summed VmHWM counts it once per process)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.harness import round_window as rw

MB = 1 << 20
SIZE = 64 * MB

MAPPER = textwrap.dedent("""
    import mmap, os, sys
    fd = os.open(sys.argv[1], os.O_RDWR)
    mm = mmap.mmap(fd, 0)
    for i in range(0, len(mm), 4096):
        mm[i] = 1  # every page in this process's RSS (RssShmem)
    print("mapped", flush=True)
    sys.stdin.readline()
""")


@pytest.fixture()
def store() -> Iterator[Path]:
    root = Path("/dev/shm") / f"fedfaas-test-peak-{os.urandom(4).hex()}"
    root.mkdir(mode=0o700)
    f = root / "arena"
    fd = os.open(f, os.O_RDWR | os.O_CREAT, 0o600)
    os.posix_fallocate(fd, 0, SIZE)  # the pages exist once, in tmpfs
    os.close(fd)
    yield root
    f.unlink()
    root.rmdir()


def test_a_store_mapped_by_two_processes_counts_once_not_twice(store: Path) -> None:
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", MAPPER, str(store / "arena")],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    try:
        for p in procs:
            assert p.stdout is not None and p.stdout.readline().strip() == "mapped"
        pids = [p.pid for p in procs]
        private = sum(
            rw.status_bytes(pid, "RssAnon") + rw.status_bytes(pid, "RssFile") for pid in pids
        )
        assert rw.tmpfs_bytes([store]) == SIZE
        once = rw.unique_rss(pids, [store])
        assert once == pytest.approx(private + SIZE, abs=4 * MB)
        twice = rw.summed_hwm(pids)["bytes"]
        assert twice >= once + SIZE - 8 * MB  # the bound counts the store in each process
        without_store = rw.unique_rss(pids)  # no store named: each one's RssShmem is its own
        assert without_store >= private + 2 * SIZE - 8 * MB
        peak = rw.PeakMemory(lambda: pids, [store], period=0.001)
        assert peak.rate_hz is None  # no samples yet
        peak.start()
        time.sleep(0.05)
        assert peak.stop() == pytest.approx(once, abs=4 * MB) and peak.samples >= 2
        assert peak.rate_hz is not None and peak.rate_hz > 0  # the rate it sampled at
    finally:
        for p in procs:
            p.kill()
            p.wait()
