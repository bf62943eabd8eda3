"""Fault tolerance: the primary cache function of a query dies mid-flight."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from bench.harness.flstore_stack import Child, FLStoreStack
from bench.harness.synthetic import write_history
from cache_engine.cold_store import MinioColdStore
from cache_engine.engine import STATS
from core.services import MinioServer, RedisServer, free_port
from tests.flstore.conftest import start_stack
from tests.flstore.tracker_queries import ended

pytestmark = pytest.mark.integration
JOB = "fault-job"


@pytest.fixture(scope="module")
def slow_stack(
    tmp_path_factory: pytest.TempPathFactory,
    redis_server: RedisServer,
    minio_server: MinioServer,
    cold: MinioColdStore,
) -> Iterator[FLStoreStack]:
    """A stack whose cache functions hold every /run for 2 s, so a query stays in flight."""
    s = start_stack(
        tmp_path_factory.mktemp("fault"),
        redis_server,
        minio_server,
        {
            "ping_interval": 0.5,
            "secondaries": 1,
            "function_env": {"FEDFAAS_FLSTORE_RUN_DELAY_S": "2"},
        },
        tracker={"query_timeout": 20, "ping_interval": 0, "engine_wait": 8},
    )
    try:
        write_history(cold, JOB, 3, per_round=5, pool=12, malicious=["c001"], seed=3)
        s.ingest(JOB, range(0, 4))
        s.wait_idle()
        yield s
    finally:
        s.stop()


def _wait_for_a_run_in_flight(st: FLStoreStack, function: str) -> dict[str, Any]:
    """The first ``/ping`` of ``function`` that counts a ``/run`` inside it (10 s at most)."""
    deadline = time.monotonic() + 10
    while True:
        ping = httpx.get(
            f"{st.runtime_url}/function/{function}/ping", headers=st.function_auth
        ).json()
        if ping["runs_in_flight"] or time.monotonic() > deadline:
            return dict(ping)
        time.sleep(0.02)


def test_killing_the_primary_mid_query_fails_over_and_restores_replicas(
    slow_stack: FLStoreStack,
) -> None:
    st = slow_stack
    body = {"workload": "multi-krum", "job": JOB, "rounds": [2], "params": {"f": 1}}
    objects = httpx.post(f"{st.engine_url}/v1/plan", headers=st.auth, json=body).json()["objects"]
    locs = httpx.get(
        f"{st.engine_url}/v1/locations", headers=st.auth, params={"ids": objects}
    ).json()
    primary, secondary = locs[objects[0]][:2]
    assert all(set(locs[o]) == {primary, secondary} for o in objects)
    pid = httpx.get(f"{st.runtime_url}/function/{primary}/ping", headers=st.function_auth).json()[
        "pid"
    ]
    # every counter is reported from the start, at 0 until it happens
    stats = httpx.get(f"{st.engine_url}/v1/state", headers=st.auth).json()["stats"]
    assert set(stats) == set(STATS) and stats["functions_lost"] == 0, stats
    restored_before = stats["restored"]

    qid = httpx.post(f"{st.tracker_url}/v1/queries", headers=st.auth, json=body).json()["id"]
    # the kill must hit the query in flight: wait until the primary is inside its /run (held 2 s
    # there), as the primary itself counts it (the tracker records a try before it calls, and
    # a fixed wait after that record could land before the call or after the run)
    ping = _wait_for_a_run_in_flight(st, primary)
    assert ping["runs_in_flight"] == 1 and ping["pid"] == pid, ping
    os.kill(pid, signal.SIGKILL)

    rec = ended(st, qid)
    assert rec["status"] == "done", rec
    assert rec["tried"][0]["function"] == primary and rec["tried"][0]["outcome"] != "ok"
    # the direct call broke with the replica; the tracker tried the gateway before moving on
    assert rec["tried"][0]["direct_failed"] and rec["tried"][0]["via"] == "gateway", rec

    assert rec["function"] != primary
    assert "c001" not in rec["result"]["selected"]

    # the engine notices (its ping finds the function gone or restarted with a new
    # incarnation), drops the dead copy and copies every object again: 2 holders each (every
    # object the policy keeps resident is counted, with 0 if no function holds it). Until it
    # notices, the table still names the killed function, so the counts alone prove nothing:
    # wait for the loss, the restore and the counts together
    def settled() -> tuple[bool, dict[str, Any], dict[str, Any]]:
        stats = httpx.get(f"{st.engine_url}/v1/state", headers=st.auth).json()["stats"]
        counts = httpx.get(f"{st.engine_url}/v1/replicas", headers=st.auth).json()
        done = (
            stats["functions_lost"] >= 1
            and stats["restored"] - restored_before >= len(objects)
            and all(n == 2 for n in counts.values())
        )
        return done, stats, counts

    deadline = time.monotonic() + 60
    done, stats, counts = settled()
    while not done and time.monotonic() < deadline:
        time.sleep(0.2)
        done, stats, counts = settled()
    assert stats["functions_lost"] >= 1, stats
    assert stats["restored"] - restored_before >= len(objects), stats
    assert set(objects) <= set(counts)
    assert all(n == 2 for n in counts.values()), counts
    assert set(stats) == set(STATS)  # no counter the engine does not declare
    # the data really is in the restored holders: the same query answers again
    again = httpx.post(
        f"{st.tracker_url}/v1/queries?wait=true", headers=st.auth, json=body, timeout=60
    ).json()
    assert again["status"] == "done" and again["result"]["selected"] == rec["result"]["selected"]


#: the longest the test lets the engine take to restart (``Child.start``'s bound): a tracker
#: that waits longer for the engine rides out any restart the test accepts, however loaded the
#: machine (a restart took over the fixture tracker's 8 s on a loaded one)
RESTART_S = 60.0


def _tracker_waiting(st: FLStoreStack, engine_wait: float) -> Child:
    """Another tracker of ``st`` (its settings, a port of its own), waiting ``engine_wait``
    seconds for the engine; started."""
    argv = list(next(c for c in st.children if c.name == "tracker").argv)
    port = free_port(st.host)
    argv[argv.index("--port") + 1] = str(port)
    argv[argv.index("--engine-wait") + 1] = str(engine_wait)
    log = st.workdir / "logs" / "tracker-waiting.log"
    return Child("tracker-waiting", argv, log, port, host=st.host).start()


@pytest.mark.slow  # over 10 s: `make test-slow`
def test_a_query_rides_out_a_cache_engine_restart_and_is_told_503_when_it_stays_down(
    slow_stack: FLStoreStack,
) -> None:
    """The engine dies (SIGKILL): a query sent meanwhile waits for it to come back (the
    supervisor restarts it in about 2 s; here within :data:`RESTART_S`, which the tracker's
    ``engine_wait`` covers) and answers; an engine that stays down longer than
    ``engine_wait`` gets the analyst a 503 ``engine_unavailable`` with Retry-After, not a 500."""
    st = slow_stack
    engine = next(c for c in st.children if c.name == "engine")
    body = {"workload": "multi-krum", "job": JOB, "rounds": [3], "params": {"f": 1}}

    waiting = _tracker_waiting(st, RESTART_S + 30)
    try:
        assert engine.proc is not None
        os.kill(engine.proc.pid, signal.SIGKILL)
        engine.proc.wait()
        t0 = time.monotonic()
        restarter = threading.Timer(0.5, engine.start, kwargs={"timeout": RESTART_S})
        restarter.start()
        try:
            r = httpx.post(
                f"http://{st.host}:{waiting.port}/v1/queries?wait=true",
                headers=st.auth,
                json=body,
                timeout=RESTART_S + 120,
            )
        finally:
            restarter.join()
    finally:
        waiting.stop()
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "done" and "c001" not in r.json()["result"]["selected"]
    assert time.monotonic() - t0 >= 0.5  # it did wait for the engine

    assert engine.proc is not None
    os.kill(engine.proc.pid, signal.SIGKILL)
    engine.proc.wait()
    try:
        t0 = time.monotonic()
        r = httpx.post(
            f"{st.tracker_url}/v1/queries?wait=true", headers=st.auth, json=body, timeout=60
        )
        waited = time.monotonic() - t0
        assert r.status_code == 503, r.text
        assert r.json()["error"] == "engine_unavailable" and "8 s" in r.json()["detail"]
        assert r.headers["retry-after"] == "1"
        assert 8.0 <= waited < 20.0
        # a query submitted in the background is refused the same way, nothing recorded
        r = httpx.post(f"{st.tracker_url}/v1/queries", headers=st.auth, json=body, timeout=60)
        assert r.status_code == 503 and r.json()["error"] == "engine_unavailable"
    finally:
        engine.start()
    r = httpx.post(f"{st.tracker_url}/v1/queries?wait=true", headers=st.auth, json=body, timeout=60)
    assert r.status_code == 200 and r.json()["status"] == "done"
