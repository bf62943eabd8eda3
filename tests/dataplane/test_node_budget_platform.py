"""One memory budget per node, on the real parts: a node gateway, the cache engine, the runtime
and its cache functions, MinIO and Redis, all given the same ``node_memory_bytes``.

A round aggregated by the gateway reaches FLStore and is answered from the cache functions;
then the gateway's store grows (a job with a large model: its global and its pre-faulted
buffer) until the store and the functions leave FLStore no room for loads. The engine's
account holds the store's bytes, the engine gives back what FLStore held, and the same query
is still answered, its models streamed from MinIO, equal to the in-process computation.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from cache_engine.node_memory import store_bytes
from core import wire
from core.auth import bearer
from tests.flstore.conftest import start_stack
from tests.flstore.gateway_round import one_round, stack_gateway
from tests.flstore.tracker_queries import ask, direct_answer
from tests.polling import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # a runtime and functions: > 10 s
JOB = "budget1"
MIB = 1 << 20
BUDGET = 768 * MIB
KEEP = 192 * MIB  # of it kept for the queries' working memory (a streamed chunk: 64 MiB)
QUERY = {"workload": "cosine-to-aggregate", "job": JOB, "rounds": [1], "params": {"bottom_k": 1}}


def _model(rng: np.random.Generator, sign: float = 1.0) -> bytes:
    return wire.encode_tensors(
        {"layer.weight": (sign * rng.standard_normal((8, 6))).astype(np.float32)}
    )


def _state(stack: Any) -> dict[str, Any]:
    return dict(httpx.get(f"{stack.engine_url}/v1/state", headers=stack.auth).json())


def test_the_stores_bytes_push_flstore_to_stream_and_the_query_still_answers(
    make_gw, tmp_path: Path, redis_server, minio_server
) -> None:  # type: ignore[no-untyped-def]
    root = Path("/dev/shm") / f"fedfaas-test-{os.urandom(4).hex()}"
    stack = start_stack(
        tmp_path / "flstore",
        redis_server,
        minio_server,
        {
            "secondaries": 0,
            "ping_interval": 0.5,
            "node_memory_bytes": BUDGET,
            "query_memory_bytes": KEEP,
            "store_root": root,
        },
    )
    try:
        gw = stack_gateway(
            make_gw, stack, minio_server, fanout=2, pool=2, shm_root=root, node_memory_bytes=BUDGET
        )
        admin = bearer(gw.gw.secret)
        one_round(  # c3 sends the others' direction reversed
            gw,
            JOB,
            _model(np.random.default_rng(5)),
            lambda c: _model(np.random.default_rng(9), -1.0 if c == "c3" else 1.0),
        )

        first = ask(stack, QUERY, within=120)
        assert first["status"] == "done" and first["result"]["flagged"] == ["c3"]
        stack.wait_idle()
        account = _state(stack)["memory_budget"]
        assert account["store_counted"] is True and account["store_bytes"] > 0
        assert account["limit_bytes"] == BUDGET
        stats0 = _state(stack)["stats"]

        # the store grows: a job whose global and pre-faulted buffer leave FLStore no room for
        # loads (past BUDGET - KEEP with the functions' memory) and the node within BUDGET
        grow = BUDGET - KEEP // 2 - store_bytes(root) - account["functions_bytes"]
        numel = max(grow // 2, 8 * MIB) // 4
        big = wire.encode_tensors({"w": np.ones(numel, np.float32)})
        r = httpx.post(
            gw.url + "/v1/jobs",
            params={"job": "ballast", "rounds": 1, "goal": 1, "clients": "x"},
            content=big,
            headers=admin,
            timeout=120,
        )
        assert r.status_code == 201, r.text
        del big
        wait_until(
            lambda: _state(stack)["stats"]["evicted_for_budget"] > stats0["evicted_for_budget"],
            60,
            "the engine gives back what FLStore held once the store grew into it",
        )
        account = _state(stack)["memory_budget"]
        assert account["store_bytes"] >= 2 * numel * 4  # the ballast job's global and buffer
        assert account["used_bytes"] >= account["store_bytes"] + account["functions_bytes"]
        assert account["used_bytes"] > BUDGET - KEEP  # no room for loads...

        again = ask(
            stack, QUERY, within=120
        )  # ...and the query is answered all the same, from MinIO
        assert again["status"] == "done", again
        stats = _state(stack)["stats"]
        streamed = stats["queries_streamed"] + stats["queries_partly_streamed"]
        assert streamed > stats0["queries_streamed"] + stats0["queries_partly_streamed"]
        direct = direct_answer(stack, minio_server, QUERY)
        for rec in (first, again):
            assert rec["result"]["cosine"] == pytest.approx(direct["cosine"], rel=1e-6)
            assert rec["result"]["ranking"] == direct["ranking"]
        assert _state(stack)["memory_budget"]["used_bytes"] <= BUDGET
        engine_log = (stack.workdir / "logs" / "engine.log").read_text(errors="replace")
        assert "Traceback" not in engine_log
    finally:
        stack.stop()
