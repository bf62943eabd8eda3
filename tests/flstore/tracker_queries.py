"""Queries through a stack's request tracker, as the FLStore tests ask them: the answer (asked
again until the engine knows the rounds), a query's record until it ends, and the answer that
the same query must have, computed in this process from the objects in MinIO."""

from __future__ import annotations

import time
from typing import Any

import httpx

from bench.harness.flstore_stack import FLStoreStack
from cache_engine.cold_store import MinioColdStore
from cache_engine.keys import ObjectKey
from cache_engine.queries import run_workload
from core.auth import bearer
from core.services import MinioServer
from tests.polling import wait_until


def ask(stack: FLStoreStack, query: dict[str, Any], within: float = 90) -> dict[str, Any]:
    """The tracker's answer to ``query`` (``wait=true``), asked again while the engine does not
    know the round yet (404: not written, 409: not ingested); fails, with the stack's logs,
    when none comes ``within`` seconds."""
    deadline, last = time.monotonic() + within, None
    while time.monotonic() < deadline:
        last = httpx.post(
            f"{stack.tracker_url}/v1/queries",
            params={"wait": "true"},
            json=query,
            headers=bearer(stack.token("analyst")),
            timeout=300,
        )
        if last.status_code == 200:
            return dict(last.json())
        assert last.status_code in (404, 409), last.text
        time.sleep(0.5)
    raise AssertionError(f"no answer: {last.text if last else ''}\n{stack.logs()}")


def direct_answer(
    stack: FLStoreStack, minio_server: MinioServer, query: dict[str, Any]
) -> dict[str, Any]:
    """``query``'s workload run in this process on the objects its plan names, read straight
    from MinIO: what the cache functions must answer."""
    cold = MinioColdStore(minio_server.endpoint, minio_server.access_key, minio_server.secret_key)
    plan = httpx.post(f"{stack.engine_url}/v1/plan", json=query, headers=stack.auth).json()
    held = {k: cold.get(k) for k in map(ObjectKey.parse, plan["objects"])}
    return dict(run_workload(query["workload"], plan["params"], held))


def ended(stack: FLStoreStack, qid: str, within: float = 60) -> dict[str, Any]:
    """Query ``qid``'s record once it is ``done`` or ``failed``."""

    def record() -> dict[str, Any] | None:
        rec = httpx.get(f"{stack.tracker_url}/v1/queries/{qid}", headers=stack.auth).json()
        return dict(rec) if rec["status"] in ("done", "failed") else None

    return wait_until(record, within, f"query {qid} to end")
