"""bench.harness.fedfaas_round.design_floor: the least memory FedFaaS's design needs for a
round, from its settings: in-flight uploads, accumulators, the published global, the idle
processes."""

from __future__ import annotations

import pytest

from bench.harness.fedfaas_round import PUBLISHED_COPIES, design_floor

MB = 1_000_000


def test_the_floor_adds_uploads_in_flight_accumulators_the_global_and_the_idle_processes() -> None:
    f = design_floor(
        45 * MB, clients=20, max_inflight=4, replicas=1, endpoints=2, idle_bytes=300 * MB
    )
    assert f["in_flight_uploads"] == 4 * 45 * MB
    assert f["accumulators"] == (1 * 2 + 1) * 45 * MB  # one per endpoint, and the top's
    assert f["published_global"] == PUBLISHED_COPIES * 45 * MB == 90 * MB
    assert f["idle_processes"] == 300 * MB
    assert f["bytes"] == (4 + 3 + 2) * 45 * MB + 300 * MB


def test_the_floor_does_not_grow_with_clients_past_the_uploads_in_flight() -> None:
    kw = {"max_inflight": 4, "replicas": 2, "endpoints": 2, "idle_bytes": 0}
    at = {n: design_floor(45 * MB, clients=n, **kw)["bytes"] for n in (20, 60, 200)}
    assert at[20] == at[60] == at[200]
    # fewer clients than the limit: only they are in flight; no limit (0): every client
    assert design_floor(MB, clients=2, **kw)["in_flight_uploads"] == 2 * MB
    no_limit = {**kw, "max_inflight": 0}
    assert design_floor(MB, clients=20, **no_limit)["in_flight_uploads"] == 20 * MB


def test_settings_that_cannot_be_are_refused() -> None:
    for bad in ({"clients": 0}, {"endpoints": 0}, {"max_inflight": -1}, {"idle_bytes": -1}):
        kw = {"clients": 20, "max_inflight": 4, "replicas": 1, "endpoints": 2, "idle_bytes": 0}
        with pytest.raises(ValueError, match="need"):
            design_floor(MB, **{**kw, **bad})
