"""A round too large for one cache function, still in its root gateway's store: the cache
functions on that node map their parts in place (no copy, no MinIO read), one lease per
update each, and the round's answer is the MinIO copies' answer. On a real gateway, real
aggregators, the real runtime, engine, tracker and MinIO."""

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
from tests.dataplane.conftest import make_gw  # noqa: F401 (the gateway fixture)
from tests.dataplane.test_gateway_rounds import Aggregators, wait_version

from .conftest import start_stack

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # over 10 s a module: `make test-slow`
JOB = "parts-in-place"
SIZE = 8 * 40 + 8  # floats of the model: 1.3 KB


def _model(base: dict[str, np.ndarray], delta: np.ndarray) -> bytes:
    flat = np.concatenate([base["layer.bias"], base["layer.weight"].ravel()]) + delta
    return wire.encode_tensors(
        {"layer.bias": flat[:8], "layer.weight": flat[8:].reshape(8, 40), "steps": base["steps"]}
    )


def test_a_round_in_parts_is_mapped_in_place_from_the_gateways_store(
    make_gw,  # noqa: F811 (the fixture imported above)
    tmp_path: Path,
    redis_server,
    minio_server,
) -> None:  # type: ignore[no-untyped-def]
    # 4 updates and the base model take 6.5 KB, a function 4 KB: the round goes in parts
    stack = start_stack(
        tmp_path / "flstore",
        redis_server,
        minio_server,
        {"secondaries": 0, "function_capacity_bytes": 4096},
    )
    try:
        gw = make_gw(
            fanout=2,
            pool=4,
            minio_endpoint=minio_server.endpoint,
            minio_credentials_file=minio_server.credentials_file("gateway"),
            engine_url=stack.engine_url,
            engine_token_file=stack.token_file("service"),
        )
        rng = np.random.default_rng(3)
        base = {
            "layer.weight": rng.standard_normal((8, 40)).astype(np.float32),
            "layer.bias": rng.standard_normal(8).astype(np.float32),
            "steps": np.array([0], np.int64),
        }
        clients = ["c0", "c1", "c2", "c3"]
        r = httpx.post(
            gw.url + "/v1/jobs",
            params={"job": JOB, "rounds": 2, "goal": 4, "clients": ",".join(clients)},
            content=_model(base, np.zeros(SIZE)),
            headers={"Authorization": f"Bearer {gw.gw.secret}"},
        )
        assert r.status_code == 201, r.text
        info = r.json()
        aggs = Aggregators(gw)
        try:
            aggs.spawn(1)
            aggs.wait_registered(1)
            direction = rng.standard_normal(SIZE)
            for c in clients:  # c3 sends the honest direction reversed
                sign = -1.0 if c == "c3" else 1.0
                up = httpx.post(
                    f"{gw.url}/v1/jobs/{JOB}/rounds/1/updates",
                    content=_model(base, sign * (direction + 0.1 * rng.standard_normal(SIZE))),
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
        query = {"workload": "multi-krum", "job": JOB, "rounds": [1], "params": {"f": 1}}
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
            assert last.status_code in (404, 409), last.text
            time.sleep(0.5)
        assert last is not None and last.status_code == 200, last.text if last else ""
        rec = last.json()
        assert rec["result"]["flagged"] == ["c3"]
        stack.wait_idle()
        state = httpx.get(f"{stack.engine_url}/v1/state", headers=stack.auth).json()
        assert state["stats"]["queries_in_parts"] >= 1, state["stats"]
        parts_held = [
            o["id"]
            for f in state["functions"]
            for o in httpx.get(
                f"{stack.runtime_url}/function/{f}/objects", headers=stack.function_auth
            ).json()["objects"]
            if "~" in o["id"] and "/1/c" in o["id"]
        ]
        assert parts_held, state
        # every update part the functions hold was mapped from the gateway's store
        assert state["stats"]["objects_handed_off"] >= len(parts_held)
        handoff = gw.gw.handoff
        assert handoff is not None and 0 < handoff.leases() <= len(clients) * len(
            state["functions"]
        )  # one per update and function that maps a part of it; the offer's own ended
        cold = MinioColdStore(
            minio_server.endpoint, minio_server.access_key, minio_server.secret_key
        )
        ids = httpx.post(f"{stack.engine_url}/v1/plan", json=query, headers=stack.auth)
        held = {k: cold.get(k) for k in map(ObjectKey.parse, ids.json()["objects"])}
        direct = run_workload(query["workload"], ids.json()["params"], held)
        assert rec["result"]["scores"] == pytest.approx(direct["scores"], rel=1e-6)
    finally:
        stack.stop()
    deadline = time.monotonic() + 10
    while handoff.leases() > 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert handoff.leases() == 0
