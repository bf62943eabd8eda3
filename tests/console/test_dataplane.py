"""The data-plane page's numbers (pure functions over a gateway's metrics and router status)."""

from __future__ import annotations

import pytest

from console.dataplane import MIN_SPAN_S, NODE_RATES, Rates, gateway_metrics, node_view

METRICS = """\
# TYPE fedfaas_gateway_updates_accepted_total counter
fedfaas_gateway_updates_accepted_total 6.0
# TYPE fedfaas_gateway_updates_rejected_total counter
fedfaas_gateway_updates_rejected_total{code="client_revoked"} 2.0
fedfaas_gateway_updates_rejected_total{code="round_not_open"} 1.0
# TYPE fedfaas_gateway_ingest_bytes_total counter
fedfaas_gateway_ingest_bytes_total 6144.0
# TYPE fedfaas_gateway_ingest_seconds histogram
fedfaas_gateway_ingest_seconds_bucket{le="+Inf"} 6.0
fedfaas_gateway_ingest_seconds_count 6.0
fedfaas_gateway_ingest_seconds_sum 0.3
# TYPE fedfaas_gateway_store_objects gauge
fedfaas_gateway_store_objects{job="a"} 4.0
fedfaas_gateway_store_objects{job="b"} 1.0
# TYPE fedfaas_gateway_store_bytes gauge
fedfaas_gateway_store_bytes{job="a"} 4096.0
fedfaas_gateway_store_bytes{job="b"} 100.0
# TYPE fedfaas_gateway_body_bytes_held gauge
fedfaas_gateway_body_bytes_held 512.0
"""

ROUTER = {
    "mode": "userspace",
    "reason": "eBPF not preferred",
    "endpoints": [
        {
            "id": 3,
            "job": 7,
            "role": "aggregator",
            "pid": 100,
            "uid": 0,
            "local": False,
            "registered_ns": 11,
            "metrics": {
                "endpoint_id": 3,
                "msgs_received": 10,
                "msgs_sent": 2,
                "bytes_received": 640,
                "bytes_sent": 128,
                "tasks_completed": 2,
                "exec_ns_total": 4_000_000,
                "drops": 0,
                "task_open": False,
            },
        },
        {"id": 1, "job": 0, "role": "", "pid": 1, "local": True, "metrics": None},
    ],
    "drops": {"cross_job": 1, "bad_size": 0},
}


def test_a_gateways_metrics_as_the_page_shows_them() -> None:
    m = gateway_metrics(METRICS)
    assert m["store"] == {"a": {"objects": 4, "bytes": 4096}, "b": {"objects": 1, "bytes": 100}}
    assert (m["store_objects"], m["store_bytes"]) == (5, 4196)
    assert (m["ingest_bytes"], m["updates_accepted"], m["body_bytes_held"]) == (6144, 6, 512)
    assert m["updates_rejected"] == {"client_revoked": 2, "round_not_open": 1}
    assert m["mean_ingest_s"] == pytest.approx(0.05)


def test_a_gateway_without_jobs_reads_zero() -> None:
    m = gateway_metrics("")
    assert m["store"] == {} and m["store_objects"] == 0 and m["ingest_bytes"] == 0
    assert m["mean_ingest_s"] is None


def test_rates_over_the_kept_samples_and_after_a_restart() -> None:
    r = Rates(window_s=10)
    names = NODE_RATES
    first = r.rates("n", 100.0, {"ingest_bytes": 0, "updates_accepted": 0}, names)
    assert set(first.values()) == {None}  # one sample: no rate yet
    too_soon = r.rates("n", 100.0 + MIN_SPAN_S / 2, {"ingest_bytes": 5}, names)
    assert set(too_soon.values()) == {None}
    two = r.rates("n", 102.0, {"ingest_bytes": 2000, "updates_accepted": 4}, names)
    assert two == {"ingest_bytes_per_s": 1000.0, "updates_per_s": 2.0}
    later = r.rates("n", 120.0, {"ingest_bytes": 2000, "updates_accepted": 4}, names)
    assert later["ingest_bytes_per_s"] == pytest.approx(0.0)  # the window moved past the rise
    restarted = r.rates("n", 121.0, {"ingest_bytes": 10, "updates_accepted": 0}, names)
    assert set(restarted.values()) == {None}  # a counter went down: it starts again


def test_sweep_forgets_what_a_poll_did_not_see() -> None:
    r = Rates()
    r.rates("gone", 1.0, {"x": 1}, (("x_per_s", "x"),))
    r.sweep()
    r.rates("kept", 2.0, {"x": 1}, (("x_per_s", "x"),))
    r.sweep()
    assert set(r.samples) == {"kept"}


def test_node_view_has_the_router_endpoints_and_rates() -> None:
    r = Rates()
    node_view("n1", gateway_metrics(METRICS), ROUTER, r, 0.0)
    later = {**ROUTER, "endpoints": [dict(ROUTER["endpoints"][0])]}
    later["endpoints"][0]["metrics"] = {**ROUTER["endpoints"][0]["metrics"], "bytes_received": 1640}
    v = node_view("n1", gateway_metrics(METRICS), later, r, 2.0)
    assert v["router"] == {"mode": "userspace", "reason": "eBPF not preferred"}
    assert v["drops"] == {"cross_job": 1, "bad_size": 0}
    (ep,) = v["endpoints"]
    assert (ep["id"], ep["job"], ep["role"], ep["tasks_completed"]) == (3, 7, "aggregator", 2)
    assert ep["mean_exec_ms"] == pytest.approx(2.0)
    assert ep["bytes_received_per_s"] == pytest.approx(500.0)
    assert v["metrics"]["ingest_bytes_per_s"] == pytest.approx(0.0)


def test_a_node_that_did_not_answer_shows_nothing_made_up() -> None:
    v = node_view("n1", None, None, Rates(), 0.0)
    assert v == {"node": "n1", "metrics": None, "router": None, "endpoints": []}
