"""bench.runinfo: the thread pinning reports the counts it set, the run block's fields."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from bench.runinfo import THREAD_ENV, pinned_threads, thread_counts


@pytest.mark.parametrize("n", [1, 2])
def test_pinned_threads_limits_every_loaded_blas_pool_and_reports_it(n: int) -> None:
    with pinned_threads(n) as pinned:
        assert pinned["requested"] == n
        assert pinned["env"] == dict.fromkeys(THREAD_ENV, str(n))
        # numpy's and scipy's BLAS are loaded by pinned_threads itself, so there is one at least
        blas = [p for p in pinned["pools"] if p["api"] == "blas"]
        assert blas, pinned
        assert all(p["threads"] == n for p in pinned["pools"]), pinned
        assert all(p["threads"] == n for p in thread_counts())


def test_pinned_threads_hands_the_count_to_child_processes_and_restores_the_environment() -> None:
    before = {k: os.environ.get(k) for k in THREAD_ENV}
    probe = (
        "import numpy, json; from bench.runinfo import thread_counts; "
        "print(json.dumps([p['threads'] for p in thread_counts()]))"
    )
    with pinned_threads(1):
        out = subprocess.run(
            [sys.executable, "-c", probe], capture_output=True, text=True, check=True
        ).stdout
    assert set(json.loads(out)) == {1}, out
    assert {k: os.environ.get(k) for k in THREAD_ENV} == before


def test_pinned_threads_refuses_zero() -> None:
    with pytest.raises(ValueError, match="n >= 1"), pinned_threads(0):
        pass
