"""bench.ebpf: the objects it hands off open on the aggregator's path; the latency split."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import numpy as np

from bench.ebpf import _summary, _write_arena_object, _write_file_object
from core import wire
from core.objstore import Namespace, StoreClient
from core.objstore.arena import STANDALONE, key_slot
from functions.aggregator.worker import _flat


def _read_as_the_aggregator(folder: Path, key: str) -> None:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        store = StoreClient.from_dir_fd(fd)  # as EndpointWorker._take_grant does
        obj = store.open(bytes.fromhex(key))
        h = wire.read_header(obj.buf)
        view = _flat(obj)
        assert h.kind == wire.KIND_UPDATE and h.data_nbytes == 4000
        assert isinstance(view, np.ndarray) and view.dtype == np.float32 and view.size == 1000
        del view
        obj.close()
        store.close()
    finally:
        os.close(fd)


def test_the_benchmark_objects_open_as_the_aggregator_opens_them() -> None:
    root = Path("/dev/shm") / f"fedfaas-test-{os.urandom(4).hex()}"
    ns = Namespace(root, "bench", "job", wire.HEADER_SIZE + 4000)
    try:
        in_arena = _write_arena_object(ns, 1000)
        assert ns.sealed(in_arena) and key_slot(bytes.fromhex(in_arena)) != STANDALONE
        _read_as_the_aggregator(ns.path, in_arena)
        plain = _write_file_object(str(ns.path), 1000)  # the path before the arena
        assert key_slot(bytes.fromhex(plain)) == STANDALONE
        assert not os.stat(ns.path / plain).st_mode & stat.S_IWUSR  # sealed
        _read_as_the_aggregator(ns.path, plain)
    finally:
        ns.close()
    assert not root.exists()


def test_summary_reports_the_handoff_and_each_named_part() -> None:
    out = _summary([3000, 1000, 2000], 0.003, 3, {"key": [10, 30, 20], "open": [900, 990, 1980]})
    assert out["n"] == 3 and out["median_us"] == 2.0 and out["p99_us"] == 3.0
    assert out["cpu_us_per_handoff"] == 1000.0
    assert out["key_median_us"] == 0.02 and out["key_p99_us"] == 0.03
    assert out["open_median_us"] == 0.99 and out["open_p99_us"] == 1.98
    assert "key_median_us" not in _summary([1], 0.0, 1)
