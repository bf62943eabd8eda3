"""The gateway exports the router's per-endpoint metrics (Prometheus and JSON) and its mode."""

from __future__ import annotations

import httpx
import pytest

from tests.aggregators import Aggregators
from tests.dataplane.rounds import create, upload, wait_version

pytestmark = pytest.mark.integration


def test_router_metrics_count_a_round_and_say_which_router_is_active(make_gw) -> None:  # type: ignore[no-untyped-def]
    gw = make_gw(fanout=2, pool=3, prefer_ebpf=False)
    info = create(gw, ["c0", "c1"], 2)
    aggs = Aggregators(gw)
    try:
        aggs.start(1)
        upload(gw.url, info["tokens"], "c0", 1, 1, 1)
        upload(gw.url, info["tokens"], "c1", 1, 2, 1)
        wait_version(gw.url, info["tokens"]["c0"], 1)
        admin = {"Authorization": f"Bearer {gw.gw.secret}"}
        assert httpx.get(gw.url + "/v1/router").status_code == 401
        status = httpx.get(gw.url + "/v1/router", headers=admin).json()
        assert status["mode"] == "userspace" and status["reason"]
        workers = [e for e in status["endpoints"] if e["role"].startswith("aggregator")]
        assert workers and all(e["job"] == info["id"] for e in workers)
        received = sum(e["metrics"]["msgs_received"] for e in workers)
        assert received >= 2  # at least the two UPDATE frames (plus TASKs)
        assert any(e["metrics"]["tasks_completed"] >= 1 for e in workers)  # E was measured
        assert httpx.get(gw.url + "/metrics").status_code == 401
        text = httpx.get(gw.url + "/metrics", headers=admin).text
        assert 'fedfaas_router_mode{mode="userspace"' in text
        assert "fedfaas_router_endpoints" in text
    finally:
        aggs.stop()
