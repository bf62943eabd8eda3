"""bench.ebpf: the objects it hands off open on the aggregator's path; the latency split."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import numpy as np

from bench.ebpf import _summary, _write_object
from fedfaas import wire
from fedfaas.objstore import StoreClient
from functions.aggregator.worker import _flat


def test_a_benchmark_object_opens_as_the_aggregator_opens_it(tmp_path: Path) -> None:
    key = _write_object(str(tmp_path), 1000)
    path = tmp_path / key
    assert not os.stat(path).st_mode & stat.S_IWUSR  # sealed, as the gateway leaves it
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        obj = StoreClient.from_dir_fd(fd).open(bytes.fromhex(key))
        h = wire.read_header(obj.buf)
        view = _flat(obj)
        assert h.kind == wire.KIND_UPDATE and h.data_nbytes == 4000
        assert isinstance(view, np.ndarray) and view.dtype == np.float32 and view.size == 1000
        del view
        obj.close()
    finally:
        os.close(fd)


def test_summary_reports_the_handoff_and_each_named_part() -> None:
    out = _summary([3000, 1000, 2000], 0.003, 3, {"key": [10, 30, 20], "open": [900, 990, 1980]})
    assert out["n"] == 3 and out["median_us"] == 2.0 and out["p99_us"] == 3.0
    assert out["cpu_us_per_handoff"] == 1000.0
    assert out["key_median_us"] == 0.02 and out["key_p99_us"] == 0.03
    assert out["open_median_us"] == 0.99 and out["open_p99_us"] == 1.98
    assert "key_median_us" not in _summary([1], 0.0, 1)
