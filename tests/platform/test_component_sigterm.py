"""Every long-running component exits on SIGTERM within its bounded grace, with work in flight
(issue 18), on the platform a user starts (``fedfaas up --with all``).

One platform, one job with completed rounds and an open one holding acknowledged updates; then,
in order: an ``aggregator`` replica and a cache function's, the request tracker (queries in flight), the cache engine,
the control plane, both node gateways (the journal still holds every acknowledged update), and
the runtime (no replica of any function is left). Each must exit within its grace
(:mod:`core.shutdown`); a stop that hangs would be killed by the test and fail it.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import numpy as np
import psutil
import pytest
from safetensors.numpy import save

from client.sdk import QueryFailed, flstore_query
from fedfaas.platform import state
from gateway.journal import Journal
from tests.platform.test_one_platform import SHAPES, Platform, platform_up, run_round

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # end to end: `make test-slow`

JOB = "sigterm"
CLIENTS = [f"c{i}" for i in range(4)]
TRACK = {"round": 2, "window": 2}
#: the components' own bounds: services and gateways 20 s; the runtime 2 x 10 + 10 s
SERVICE_GRACE = 20.0
RUNTIME_GRACE = 30.0
#: what a loaded 2-core machine adds to a process's exit
SLACK = 10.0


@pytest.fixture(scope="module")
def platform(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Platform]:
    with platform_up(tmp_path_factory.mktemp("sigterm") / "state") as p:
        yield p


def _pid(p: Platform, service: str) -> int:
    st = state.load(p.state_dir)
    assert st is not None
    return next(s.pid for s in st.services if s.name == service)


def _sigterm(pid: int, grace: float) -> float:
    """SIGTERM ``pid``; its exit within ``grace`` + slack (seconds it took), else kill it and
    fail."""
    proc = psutil.Process(pid)
    t0 = time.monotonic()
    proc.terminate()
    try:
        proc.wait(grace + SLACK)
    except psutil.TimeoutExpired:
        proc.kill()
        pytest.fail(f"pid {pid} ({proc.name()}) still running {grace + SLACK:.0f}s after SIGTERM")
    return time.monotonic() - t0


def _acknowledged(p: Platform, rnd: int) -> set[str]:
    creds = p.state_dir / "secrets" / "redis-gateway.json"  # the gateways' Redis user
    st = state.load(p.state_dir)
    assert st is not None

    async def read() -> set[str]:
        j = Journal(f"redis://{st.host}:{st.ports['redis']}/0", creds)
        try:
            return set(await j.round_updates(JOB, rnd))
        finally:
            await j.close()

    return asyncio.run(read())


def test_every_component_stops_within_its_grace_with_work_in_flight(platform: Platform) -> None:
    p = platform
    p.create_job(JOB, CLIENTS, rounds=3)
    for rnd in (1, 2):
        run_round(p, JOB, CLIENTS, rnd, seed=rnd)
    p.wait_open(JOB, 3)
    acked = []
    for c in CLIENTS[:2]:  # round 3 stays open with two acknowledged updates
        with p.client(JOB, c) as fl:
            fl.wait_for_version(2, timeout=120)
            fl.upload(3, save({k: np.ones(s, np.float32) for k, s in SHAPES.items()}), 1)
            acked.append(c)
    analyst = (p.state_dir / "secrets" / "analyst-token").read_text().strip()
    flstore_query(p.urls["request_tracker"], "track", JOB, params=TRACK, token=analyst)

    # function replicas (the runtime's stop of a replica is bounded by its 10 s stop_grace):
    # an aggregator and the cache function that answered the query
    # the supervisor first: it would start each stopped component again (its own test is in
    # test_one_platform.py); this test is about each component's own clean stop
    _sigterm(_pid(p, "supervisor"), SERVICE_GRACE)
    took = {"aggregator replica": _sigterm(p.replicas()[0]["pid"], 10.0)}
    cache = p.replicas(function="flstore-cache-0")[0]["pid"]
    took["cache function replica"] = _sigterm(cache, 10.0)

    # the tracker with queries in flight: each is answered or refused, none hangs
    stop, stopping = threading.Event(), threading.Event()
    outcomes: list[str] = []

    def ask() -> None:
        while not stop.is_set():
            try:
                flstore_query(  # a tracker that stays away: refused after 5 s
                    p.urls["request_tracker"], "track", JOB, params=TRACK, token=analyst, wait=5
                )
                outcomes.append("answered")
            except QueryFailed as exc:
                outcomes.append(exc.error)
                if stopping.is_set():
                    return
                # before the tracker's SIGTERM: the cache function stopped above may take
                # longer than the 5 s to start again; ask again
                time.sleep(0.2)

    askers = [threading.Thread(target=ask, daemon=True) for _ in range(3)]
    for t in askers:
        t.start()
    # the tracker answers one query before its SIGTERM (the first may wait for the cache
    # function stopped above to start again); the askers keep asking, so queries are in flight
    deadline = time.monotonic() + 60
    while "answered" not in outcomes and time.monotonic() < deadline:
        time.sleep(0.05)
    stopping.set()
    took["request tracker"] = _sigterm(_pid(p, "request-tracker"), SERVICE_GRACE)
    stop.set()
    for t in askers:
        t.join(30)
        assert not t.is_alive(), "a query to the stopped tracker hangs"
    assert "answered" in outcomes, outcomes

    took["cache engine"] = _sigterm(_pid(p, "cache-engine"), SERVICE_GRACE)
    took["control plane"] = _sigterm(_pid(p, "control-plane"), SERVICE_GRACE)
    for name in ("gateway-node1", "gateway"):
        took[name] = _sigterm(_pid(p, name), SERVICE_GRACE)
    assert set(acked) <= _acknowledged(p, 3), "an acknowledged update is not in the journal"

    runtime = psutil.Process(_pid(p, "runtime"))
    children = runtime.children(recursive=True)
    assert len(children) >= 2  # aggregator and flstore-cache replicas
    took["runtime"] = _sigterm(runtime.pid, RUNTIME_GRACE)
    gone, alive = psutil.wait_procs(children, timeout=5)
    assert not alive, f"replicas left after the runtime stopped: {alive}"
    print("seconds to exit after SIGTERM:", {k: round(v, 2) for k, v in took.items()})
