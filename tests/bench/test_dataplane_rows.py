"""bench.dataplane's round rows: each comparison names its window and method, a failed side
shows what stopped it, and the absent SF round says why."""

from __future__ import annotations

from typing import Any

from bench import dataplane
from bench.harness import round_window as rw


def _round(router: str) -> dict[str, Any]:
    return {
        "ok": True,
        "fanout": 2,
        "max_inflight": 4,
        "router": router,
        "clients": 20,
        "update_bytes": 44_764_968,
        "e2e_s": 2.0,
        "server_s": 1.5,
        "server_gateway_mark_s": 1.49,
        "server_hwm_bytes": 1_000_000_000,
        "server_processes": 4,
        "act_s": 1.4,
        "ingest_s": 1.2,
        "after_ingest_s": 0.2,
        "act_over_ingest": 1.4 / 1.2,
    }


def _flower() -> dict[str, Any]:
    return {"ok": True, "e2e_s": 8.0, "server_s": 6.0, "server_hwm_bytes": 5_000_000_000}


def _res(flower: dict[str, Any] | None) -> dict[str, Any]:
    return {
        "threads": {"env": {"OMP_NUM_THREADS": "1"}, "pools": []},
        "round": _round("ebpf"),
        "round_userspace": _round("userspace"),
        "flower": flower,
    }


def test_every_round_row_names_its_window_and_compares_like_with_like() -> None:
    rows = dataplane._round_rows(_res(_flower()))
    e2e = [r for r in rows if "weights in client memory -> global model available" in r]
    server = [r for r in rows if "server-side window only" in r]
    mem = [r for r in rows if "sum of VmHWM" in r]
    assert len(e2e) == len(server) == len(mem) == 2  # eBPF and userspace rounds
    assert "| 2.00 | Flower 8.00 | 4.0x faster |" in e2e[0]
    assert "clients serialise inside the window" in e2e[0]
    assert "| 1.50 (gateway's own mark 1.49) | Flower 6.00 | 4.0x faster |" in server[0]
    assert "| 1.00 | Flower 5.00 | 5.0x less |" in mem[0]
    assert all("env 1 in every process" in r for r in e2e + server + mem)


def test_a_killed_flower_point_shows_its_size_not_a_ratio() -> None:
    killed = rw.failure("killed", "over", server_rss_bytes=16_000_000_000)
    rows = dataplane._round_rows(_res(killed))
    e2e = next(r for r in rows if "weights in client memory" in r)
    assert "Flower killed at 16.00 GB |  |" in e2e


def test_the_sf_round_is_reported_absent_with_the_reason() -> None:
    rows = dataplane._round_rows(_res(None))
    sf = next(r for r in rows if r.startswith("| round (SF: HTTP between aggregators)"))
    assert "neither the gateway nor the aggregator has an HTTP hand-off mode" in sf
    assert any("Flower (not run)" in r for r in rows)


def test_the_sf_reason_holds_no_setting_selects_an_http_hand_off() -> None:
    # what SF_ABSENT says: the gateway's settings offer no hand-off transport to choose, and the
    # aggregator takes no work over HTTP (functions/aggregator/handler_test.py: 405 on POST)
    from gateway.settings import GatewaySettings

    names = set(GatewaySettings.model_fields)
    assert not {n for n in names if "handoff" in n or "hand_off" in n or "transport" in n}
