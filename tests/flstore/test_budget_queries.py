"""A node whose memory budget is below one round's size: queries are still answered, from
MinIO (each cache function reads its range of the models a chunk at a time and keeps
nothing), nothing runs out of memory, and the engine logs no traceback. On the real runtime,
engine, tracker and MinIO; answers compared with the in-process reference."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from bench.harness.flstore_stack import FLStoreStack
from cache_engine.cold_store import MinioColdStore
from core.services import MinioServer, RedisServer

from .conftest import start_stack
from .rounds import DIGITS, JOB, QUERIES, bodies, direct, engine_log, same, state, write_jobs
from .tracker_queries import ask

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # over 10 s a module: `make test-slow`


@pytest.fixture(scope="module")
def tight_stack(
    tmp_path_factory: pytest.TempPathFactory,
    redis_server: RedisServer,
    minio_server: MinioServer,
    cold: MinioColdStore,
) -> Iterator[FLStoreStack]:
    """A node whose memory budget (1 MiB) is below one round's size (200 KiB of updates of
    the synthetic job is below it, but the cache functions' own memory is far above)."""
    write_jobs(cold, "-tight")
    s = start_stack(
        tmp_path_factory.mktemp("tight"),
        redis_server,
        minio_server,
        {"node_memory_bytes": 1 << 20, "ping_interval": 0.5},
    )
    try:
        for job in (JOB, DIGITS):
            s.ingest(job + "-tight", range(0, 3))
        s.wait_idle(120)
        yield s
    finally:
        s.stop()


@pytest.mark.parametrize("body", bodies("-tight"), ids=[q["workload"] for q in QUERIES])
def test_past_the_memory_budget_queries_are_answered_from_minio_keeping_nothing(
    tight_stack: FLStoreStack, cold: MinioColdStore, body: dict[str, Any]
) -> None:
    rec = ask(tight_stack, body)
    same(rec["result"], direct(cold, body))
    st = state(tight_stack)
    assert st["stats"]["queries_streamed"] >= 1
    assert all(i["alive"] for i in st["functions"].values())  # nothing OOMed
    held = httpx.get(
        f"{tight_stack.runtime_url}/function/flstore-cache-0/objects",
        headers=tight_stack.function_auth,
    ).json()["objects"]
    assert not [o for o in held if not o["id"].endswith("/meta")], held  # no model kept
    log = engine_log(tight_stack)
    assert "Traceback" not in log
    # each failed load (the prefetch past the budget) is one line of the log, counted
    assert log.count(" skipped: ") + log.count("load on ") >= st["stats"]["loads_failed"]
