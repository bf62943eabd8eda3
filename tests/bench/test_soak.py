"""The soak's bookkeeping (``bench/soak.py``): which failures are errors, the memory verdict, the
table; and (slow) a short soak on the real platform with a fault in the middle."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from bench.faults import FAULTS
from bench.soak import KILLS, check_models, main, memory_summary, pss
from bench.soak_stats import classify, read_stats
from loadtests.updates import MODEL, ack_line, read_acks, update_of, weight_of


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


def _published(counted: dict[int, list[str]], tamper: dict[int, float] | None = None):  # type: ignore[no-untyped-def]
    """Rounds as a gateway that counted ``counted`` publishes them (the exact FedAvg of
    those clients' updates, in float32; round 0 the initial model), each model scaled by
    ``tamper[round]`` if given."""

    def read(rnd: int):  # type: ignore[no-untyped-def]
        if rnd == 0:
            return {"clients": {}, "count": 0}, MODEL.zeros()
        if rnd not in counted:
            return None
        ups = [(update_of(c, rnd), weight_of(c)) for c in counted[rnd]]
        total = sum(w for _, w in ups)
        scale = (tamper or {}).get(rnd, 1.0)
        model = {
            k: (scale * sum(w * u[k].astype(np.float64) for u, w in ups) / total).astype(np.float32)
            for k in ups[0][0]
        }
        return {"clients": {c: {} for c in counted[rnd]}, "count": len(counted[rnd])}, model

    return read


def _acks(rounds: dict[int, dict[str, str]]) -> dict[int, dict[str, str]]:
    """Through the ack file's own format, as the load writes it."""
    return read_acks(ack_line(c, r, how) for r, a in rounds.items() for c, how in a.items())


def test_the_clients_update_is_the_campaigns_small_model_drawn_from_its_names() -> None:
    u = update_of("c3", 7)
    assert list(u) == ["w", "b"] and u["w"].shape == (256, 256) and u["w"].dtype == np.float32
    assert np.array_equal(u["w"], update_of("c3", 7)["w"])  # the same in every process
    assert not np.array_equal(u["w"], update_of("c3", 8)["w"])
    assert (weight_of("c0"), weight_of("c7")) == (1, 3)


def test_the_clients_check_passes_the_exact_fedavg_of_what_they_got_acknowledged() -> None:
    acks = _acks(
        {1: {"c0": "202", "c1": "202"}, 2: {"c0": "202", "c1": "duplicate"}, 3: {"c1": "202"}}
    )
    out = check_models(acks, _published({1: ["c0", "c1"], 2: ["c0", "c1"]}), 2, patience=0)
    assert out["exact"] and out["rounds_checked"] == 2 and out["max_rel_err"] <= 1e-6
    assert (out["acked"], out["acked_via_duplicate"], out["lost"], out["pending"]) == (4, 1, 0, 1)
    assert out["double"] == 0


def test_the_clients_check_catches_a_wrong_model_a_lost_update_and_an_unacknowledged_one() -> None:
    acks = _acks({1: {"c0": "202", "c1": "202"}, 2: {"c0": "202", "c1": "202"}, 3: {"c2": "202"}})
    counted = {1: ["c0", "c1"], 2: ["c0", "c1"]}
    # round 1's model is off by 1e-5 (a weight or an update wrong): caught
    off = check_models(acks, _published(counted, {1: 1 + 1e-5}), 2, patience=0)
    assert not off["exact"] and off["wrong"] == [1] and off["lost"] == 0
    # round 2 published without c1's acknowledged update: lost, and the model is not the
    # FedAvg of what was acknowledged
    dropped = check_models(acks, _published({**counted, 2: ["c0"]}), 2, patience=0)
    assert dropped["lost"] == 1 and dropped["wrong"] == [2] and not dropped["exact"]
    # c3 counted in round 3 without the client's acknowledgement
    extra = check_models(acks, _published({**counted, 3: ["c2", "c3"]}), 3, patience=0)
    assert extra["double"] == 1 and extra["wrong"] == [3]
    # a round that has no checkpoint: its acknowledged updates count as lost
    gone = check_models(acks, _published({1: ["c0", "c1"]}), 2, patience=0)
    assert gone["missing"] == [2] and gone["lost"] == 2 and not gone["exact"]


@pytest.mark.slow
def test_a_short_soak_on_the_platform_has_no_error_outside_the_fault(tmp_path: Path) -> None:
    """40 s of the whole load on ``fedfaas up --with all`` (TLS, its default: locust's users
    verify the parts against its CA), an aggregator replica killed at 20 s: rounds complete,
    every route answered, no error outside the fault window."""
    rc = main(["--duration", "40", "--fault", "replica", "--warmup", "10", "--out", str(tmp_path)])
    r = json.loads((tmp_path / "soak.json").read_text())
    assert rc == 0, r["failures"]
    assert r["tls"] is True  # the platform users get
    assert r["rounds_completed"] >= 2 and not r["job_failed"]
    ch = r["clients_check"]  # every round's model checked from the clients' side
    assert ch["exact"] and ch["rounds_checked"] == r["rounds_completed"]
    assert ch["lost"] == 0 and ch["double"] == 0 and ch["acked"] >= 2 * 16
    routes = {x["route"]: x for x in r["routes"]}
    for name in ("control plane: assignment", "gateway: upload", "Aggregated"):
        assert routes[name]["requests"] > 0, routes
    assert any(k.startswith("tracker: ") for k in routes)
    assert r["fault"]["name"] == "replica" and r["fault"]["recovery_s"] is not None
    assert r["memory"]["total"]["start"] > 0 and r["memory"]["components"]["gateway"]["end"] > 0
    red = r["memory"]["redis"]["end"]  # Redis by key family: who holds its memory
    assert red["used_memory"] > 0 and red["fedfaas:control:"] > 0 and red["flstore:query:"] > 0
    md = (tmp_path / "soak.md").read_text()
    assert (
        md.startswith("# Soak") and "`fedfaas up --with all` on loopback (TLS, its default)" in md
    )
    assert (tmp_path / "soak.png").stat().st_size > 0


def test_a_route_with_no_answer_yet_has_no_latency_not_zero(tmp_path: Path) -> None:
    """locust writes ``N/A`` for the percentiles of a route that has no answered request:
    read as none (the table says n/a), not as 0 ms."""
    head = "Type,Name,Request Count,Failure Count,Average Response Time,Requests/s,50%,99%"
    (tmp_path / "s_stats.csv").write_text(
        f"{head}\nPOST,tracker: track,0,0,0.0,0.0,N/A,N/A\n,Aggregated,3,1,12.5,0.3,11,40\n"
    )
    rows = {r["route"]: r for r in read_stats(tmp_path / "s")}
    assert rows["tracker: track"]["p50_ms"] is rows["tracker: track"]["p99_ms"] is None
    assert rows["Aggregated"]["p99_ms"] == 40.0 and rows["Aggregated"]["failures"] == 1
