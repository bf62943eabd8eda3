"""LIFL -> FLStore: a round the gateway aggregates is checkpointed, announced to the cache engine,
and answerable by the request tracker from cache functions that already hold it."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from cache_engine.cold_store import MinioColdStore
from cache_engine.keys import ObjectKey
from cache_engine.queries import run_workload
from core import wire
from core.auth import bearer
from tests.dataplane.test_gateway_rounds import Aggregators, wait_version
from tests.flstore.conftest import start_stack

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # over 10 s a module: `make test-slow`
JOB = "lifl2fls"


def _model(base: dict[str, np.ndarray], delta: np.ndarray, sign: float) -> bytes:
    flat = np.concatenate([base["layer.bias"], base["layer.weight"].ravel()])
    moved = flat + sign * delta
    return wire.encode_tensors(
        {"layer.bias": moved[:8], "layer.weight": moved[8:].reshape(8, 5), "steps": base["steps"]}
    )


def test_aggregated_round_flows_into_flstore_and_a_sign_flipper_is_flagged(
    make_gw, tmp_path: Path, redis_server, minio_server
) -> None:  # type: ignore[no-untyped-def]
    stack = start_stack(tmp_path / "flstore", redis_server, minio_server, {"secondaries": 1})
    try:
        gw = make_gw(
            fanout=2,
            pool=4,
            minio_endpoint=minio_server.endpoint,
            minio_credentials_file=minio_server.credentials_file("gateway"),
            engine_url=stack.engine_url,
            engine_token_file=stack.token_file("service"),
        )
        rng = np.random.default_rng(7)
        base = _base()
        clients = ["c0", "c1", "c2", "c3"]
        r = httpx.post(
            gw.url + "/v1/jobs",
            params={"job": JOB, "rounds": 2, "goal": 4, "clients": ",".join(clients)},
            content=_model(base, np.zeros(48), 0),
            headers={"Authorization": f"Bearer {gw.gw.secret}"},
        )
        assert r.status_code == 201, r.text
        info = r.json()
        aggs = Aggregators(gw)
        try:
            aggs.spawn(1)
            aggs.wait_registered(1)
            direction = rng.standard_normal(48)
            for c in clients:  # c3 sends the honest direction reversed
                sign = -1.0 if c == "c3" else 1.0
                body = _model(base, direction + 0.1 * rng.standard_normal(48), sign)
                up = httpx.post(
                    f"{gw.url}/v1/jobs/{JOB}/rounds/1/updates",
                    content=body,
                    headers={
                        "Authorization": f"Bearer {info['tokens'][c]}",
                        "X-Client-Id": c,
                        "X-Sample-Count": "10",
                    },
                )
                assert up.status_code == 202, up.text
            wait_version(gw.url, info["tokens"]["c0"], 1, job=JOB)
        finally:
            aggs.stop()
        query = {
            "workload": "cosine-to-aggregate",
            "job": JOB,
            "rounds": [1],
            "params": {"bottom_k": 1},
        }
        deadline, last = time.monotonic() + 90, None
        while time.monotonic() < deadline:  # until the engine has ingested the round
            last = httpx.post(
                f"{stack.tracker_url}/v1/queries",
                params={"wait": "true"},
                json=query,
                headers=bearer(stack.token("analyst")),
                timeout=120,
            )
            if last.status_code == 200:
                break
            assert last.status_code in (404, 409), last.text  # not written / not known yet
            time.sleep(0.5)
        assert last is not None and last.status_code == 200, (
            last.text if last else "",
            stack.logs(),
        )
        rec = last.json()
        assert rec["status"] == "done" and rec["hit"] is True  # hot before the query came
        assert rec["result"]["flagged"] == ["c3"]
        # the cache functions mapped the round's updates in the gateway's store (zero-copy
        # handoff), each copy under its own lease, and answer as the MinIO copies do
        stack.wait_idle()  # the engine ended the offer once the round's placement claimed it
        stats = httpx.get(f"{stack.engine_url}/v1/state", headers=stack.auth).json()["stats"]
        lent = stats["objects_handed_off"]
        assert lent in (len(clients), 2 * len(clients)), stats  # the primary's, a secondary's
        assert stats["offers_ended"] == 1, stats
        handoff = gw.gw.handoff
        assert handoff is not None and handoff.leases() == lent  # the offer's own went back
        cold = MinioColdStore(
            minio_server.endpoint, minio_server.access_key, minio_server.secret_key
        )
        ids = httpx.post(f"{stack.engine_url}/v1/plan", json=query, headers=stack.auth)
        held = {k: cold.get(k) for k in map(ObjectKey.parse, ids.json()["objects"])}
        direct = run_workload(query["workload"], ids.json()["params"], held)
        assert rec["result"]["cosine"] == pytest.approx(direct["cosine"], rel=1e-6)
        assert rec["result"]["ranking"] == direct["ranking"]
    finally:
        stack.stop()
    # the functions died: their leases went back with their connections
    deadline = time.monotonic() + 10
    while handoff.leases() > 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert handoff.leases() == 0  # nothing keeps the round's updates in the store any more


def _base() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "layer.weight": rng.standard_normal((8, 5)).astype(np.float32),
        "layer.bias": rng.standard_normal(8).astype(np.float32),
        "steps": np.array([0], np.int64),
    }
