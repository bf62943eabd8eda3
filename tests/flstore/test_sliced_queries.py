"""Rounds larger than one cache function, on the real runtime, engine, tracker and MinIO.

Each cache function may hold 64 KiB (a tiny capacity): a round of 12 updates of 16 KiB and a
digits round of 30 clients do not fit one, so their queries run over coordinate parts across
several functions, one reducer combining them. Every answer is compared with the same workload
computed in this process on the whole vectors read from MinIO (the obvious reference). The
budget smaller than a round: ``test_budget_queries.py``; the slow tier does the same at
ResNet-18 size (``tests/bench/test_flstore_rounds.py``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from bench.harness.flstore_stack import FLStoreStack
from cache_engine.cold_store import MinioColdStore
from core.services import MinioServer, RedisServer

from .conftest import start_stack
from .rounds import DIGITS, JOB, QUERIES, direct, engine_log, same, state, write_jobs
from .tracker_queries import ask

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # end to end: `make test-slow`
CAPACITY = 64 << 10


@pytest.fixture(scope="module")
def parts_stack(
    tmp_path_factory: pytest.TempPathFactory,
    redis_server: RedisServer,
    minio_server: MinioServer,
    cold: MinioColdStore,
) -> Iterator[FLStoreStack]:
    write_jobs(cold, "")
    s = start_stack(
        tmp_path_factory.mktemp("parts"),
        redis_server,
        minio_server,
        {"function_capacity_bytes": CAPACITY, "ping_interval": 0.5, "evict_grace": 0.5},
    )
    try:
        for job in (JOB, DIGITS):
            s.ingest(job, range(0, 3))
        s.wait_idle(120)
        yield s
    finally:
        s.stop()


@pytest.mark.parametrize("body", QUERIES, ids=[q["workload"] for q in QUERIES])
def test_a_round_larger_than_a_function_is_answered_across_functions_as_in_process(
    parts_stack: FLStoreStack, cold: MinioColdStore, body: dict[str, Any]
) -> None:
    rec = ask(parts_stack, body)
    same(rec["result"], direct(cold, body))
    st = state(parts_stack)
    holding = [f for f, i in st["functions"].items() if i["objects"]]
    assert len(holding) >= 2, st["functions"]
    assert all(i["used_bytes"] <= CAPACITY for i in st["functions"].values())
    assert st["stats"]["queries_in_parts"] >= 1


def test_the_parts_stay_for_the_next_query_and_failed_loads_are_one_line_each(
    parts_stack: FLStoreStack,
) -> None:
    body = QUERIES[1]
    ask(parts_stack, body)
    before = state(parts_stack)["stats"]
    rec = ask(parts_stack, body)  # the same parts, held: nothing loaded
    after = state(parts_stack)["stats"]
    assert rec["loaded"] == 0 and after["objects_loaded"] == before["objects_loaded"]
    log = engine_log(parts_stack)
    assert "Traceback" not in log, log[-4000:]
    # a prefetch that found every function full is one line of the log, counted
    assert log.count(" skipped: ") + log.count("load on ") >= after["loads_failed"]
