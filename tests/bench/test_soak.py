"""The soak's bookkeeping (``bench/soak.py``): which failures are errors, the memory verdict, the
table; and (slow) a short soak on the real platform with a fault in the middle."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from bench.faults import FAULTS
from bench.soak import KILLS, classify, main, memory_summary, pss


def test_failures_inside_the_fault_window_are_expected_and_the_others_are_errors() -> None:
    refused = "CatchResponseError('HTTP 0: ConnectionRefusedError(111, 'refused')')"
    wrong = 'CatchResponseError(\'HTTP 409: {"error": "wrong_node", "detail": "c5"}\')'
    failures = [
        {"t": 99.0, "name": "gateway: upload", "error": wrong},
        {"t": 100.0, "name": "gateway: upload", "error": refused},
        {"t": 104.9, "name": "control plane: assignment", "error": "HTTP 503: busy"},
        {"t": 105.1, "name": "tracker: multi-krum", "error": "RemoteDisconnected('closed')"},
    ]
    out = classify(failures, (100.0, 105.0))
    assert out["in_fault_window"] == {
        "gateway: upload: HTTP 0": 1,
        "control plane: assignment: HTTP 503": 1,
    }
    assert out["outside"] == {
        "gateway: upload: HTTP 409 wrong_node": 1,
        "tracker: multi-krum: RemoteDisconnected": 1,
    }
    assert (out["errors"], out["expected"]) == (2, 2)
    assert [e["t"] for e in out["outside_examples"]] == [99.0, 105.1]
    # without a fault every failure is an error
    assert classify(failures, (float("inf"), float("inf")))["errors"] == 4


def test_memory_is_compared_from_the_first_sample_after_the_warmup_to_the_last() -> None:
    mib = 2**20
    samples = [
        {"t": 0.0, "pss": {"gateway": 10 * mib, "redis": 5 * mib}},
        {"t": 60.0, "pss": {"gateway": 100 * mib, "redis": 10 * mib}},
        {"t": 300.0, "pss": {"gateway": 105 * mib, "redis": 10 * mib, "cache functions": mib}},
        {"t": 600.0, "pss": {"gateway": 108 * mib, "redis": 12 * mib}},
    ]
    m = memory_summary(samples, warmup=60.0)
    assert (m["start_t"], m["end_t"]) == (60.0, 600.0)
    assert m["components"]["gateway"]["ratio"] == pytest.approx(1.08)
    assert m["components"]["redis"]["ratio"] == pytest.approx(1.2)
    assert m["total"]["ratio"] == pytest.approx(120 / 110)
    assert memory_summary(samples[:1], warmup=60.0) == {}


def test_pss_of_this_process_is_positive_and_of_a_gone_one_zero() -> None:
    assert pss(os.getpid()) > 1 << 20
    assert pss(2**22 + 12345) == 0


def test_the_soak_injects_only_kills_and_outages() -> None:
    assert set(KILLS) <= set(FAULTS) and not {"disconnects", "shm-full"} & set(KILLS)
    assert all(FAULTS[k].during == "upload" for k in KILLS)
    assert {"gateway", "root-gateway", "replica", "redis", "minio"} <= set(KILLS)


@pytest.mark.slow
def test_a_short_soak_on_the_platform_has_no_error_outside_the_fault(tmp_path: Path) -> None:
    """40 s of the whole load on ``fedfaas up --with all``, an aggregator replica killed at
    20 s: rounds complete, every route answered, no error outside the fault window."""
    rc = main(["--duration", "40", "--fault", "replica", "--warmup", "10", "--out", str(tmp_path)])
    r = json.loads((tmp_path / "soak.json").read_text())
    assert rc == 0, r["failures"]
    assert r["rounds_completed"] >= 2 and not r["job_failed"]
    routes = {x["route"]: x for x in r["routes"]}
    for name in ("control plane: assignment", "gateway: upload", "Aggregated"):
        assert routes[name]["requests"] > 0, routes
    assert any(k.startswith("tracker: ") for k in routes)
    assert r["fault"]["name"] == "replica" and r["fault"]["recovery_s"] is not None
    assert r["memory"]["total"]["start"] > 0 and r["memory"]["components"]["gateway"]["end"] > 0
    red = r["memory"]["redis"]["end"]  # Redis by key family: who holds its memory
    assert red["used_memory"] > 0 and red["fedfaas:control:"] > 0 and red["flstore:query:"] > 0
    assert (tmp_path / "soak.md").read_text().startswith("# Soak")
    assert (tmp_path / "soak.png").stat().st_size > 0
