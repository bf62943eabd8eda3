"""The control plane's OpenFaaS client (``core.openfaas.AsyncOpenFaaS``): request shapes
(unit), then against the real embedded runtime, then the coordinator scaling by demand."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import httpx
import pytest

from control_plane.coordinator import Coordinator
from core.openfaas import AsyncOpenFaaS as Provider
from core.openfaas import OpenFaaSError, read_basic_auth
from runtime import RuntimeProcess

ROOT = Path(__file__).resolve().parents[2]


def test_request_shapes_of_scale_and_describe_with_a_mock_transport():
    """Unit test of the HTTP requests the client builds (no server involved)."""
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.url.path.startswith("/system/scale-function/"):
            return httpx.Response(202)
        return httpx.Response(200, json={"name": "agg", "replicas": 3, "availableReplicas": 2})

    async def go():
        async with Provider(
            "http://gw:8080/",
            ("admin", "pw"),
            namespace="openfaas-fn",
            transport=httpx.MockTransport(handler),
        ) as p:
            await p.scale("agg", 3)
            return await p.function("agg")

    st = asyncio.run(go())
    assert (st.replicas, st.available_replicas) == (3, 2)
    scale, desc = seen
    assert scale.method == "POST" and scale.url.path == "/system/scale-function/agg"
    assert json.loads(scale.content) == {
        "serviceName": "agg",
        "replicas": 3,
        "namespace": "openfaas-fn",
    }
    assert scale.headers["authorization"].startswith("Basic ")
    assert desc.method == "GET" and desc.url.path == "/system/function/agg"
    assert desc.url.params["namespace"] == "openfaas-fn"


@pytest.fixture(scope="module")
def runtime(tmp_path_factory):
    """The real embedded runtime (runtime) with basic auth and the echo function."""
    d = tmp_path_factory.mktemp("runtime")
    rt = RuntimeProcess(stack=ROOT / "stack.yml", state_dir=d / "state")
    rt.start(60)
    try:
        url = rt.url
        secret = {"name": "fedfaas-function-token", "value": "control-test-token"}
        r = httpx.post(f"{url}/system/secrets", auth=rt.auth, json=secret)
        assert r.status_code == 202, r.text
        r = httpx.post(
            f"{url}/system/functions",
            auth=rt.auth,
            json={
                "service": "echo",
                "image": "ghcr.io/fedfaas/echo:0.1.0",
                "secrets": ["fedfaas-function-token"],
            },
        )
        assert r.status_code == 202, r.text
        yield url, rt.auth_dir
    finally:
        rt.stop()


def wait_available(url, auth, name, n, timeout=60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        st = asyncio.run(_status(url, auth, name))
        if st.replicas == n and st.available_replicas == n:
            return st
        time.sleep(0.2)
    raise AssertionError(f"{name} never reached {n} available replicas")


async def _status(url, auth, name):
    async with Provider(url, auth) as p:
        return await p.function(name)


@pytest.mark.integration
def test_scale_and_describe_against_the_real_embedded_runtime(runtime):
    url, auth_dir = runtime
    auth = read_basic_auth(auth_dir)

    async def scale(n):
        async with Provider(url, auth) as p:
            assert await p.healthz()
            await p.scale("echo", n)

    asyncio.run(scale(2))
    assert wait_available(url, auth, "echo", 2).name == "echo"
    asyncio.run(scale(1))
    wait_available(url, auth, "echo", 1)


@pytest.mark.integration
def test_runtime_errors_become_provider_errors_with_the_status(runtime):
    url, auth_dir = runtime

    async def go(auth, name):
        async with Provider(url, auth) as p:
            await p.scale(name, 1)

    with pytest.raises(OpenFaaSError) as bad_auth:
        asyncio.run(go(("admin", "wrong"), "echo"))
    assert bad_auth.value.status == 401
    with pytest.raises(OpenFaaSError) as missing:
        asyncio.run(go(read_basic_auth(auth_dir), "no-such-function"))
    assert missing.value.status == 404


SLOW_HANDLER = """\
import os
import time

time.sleep(float(os.environ.get("STARTUP_DELAY_S", "0")))  # a replica that takes a while to warm


def handle(event, context):
    return {"statusCode": 200, "body": "ok"}
"""


async def _available(p: Provider, name: str, n: int, timeout: float = 60.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        st = await p.function(name)
        if st.replicas == n and st.available_replicas == n:
            return st
        await asyncio.sleep(0.1)
    raise AssertionError(f"{name} never reached {n} available replicas")


@pytest.mark.slow  # over 5 s: `make test-slow`
@pytest.mark.integration
def test_coordinator_scales_the_function_by_the_demand_the_gateways_report(
    runtime, gateways, tmp_path
):
    """Up by what the nodes lack, not again while that scale-up starts, never past
    ``scale.max``, and down to ``scale.min`` once every node was idle ``scale_down_after``."""
    url, auth_dir = runtime
    auth = read_basic_auth(auth_dir)
    (tmp_path / "slow").mkdir()
    (tmp_path / "slow" / "handler.py").write_text(SLOW_HANDLER)
    r = httpx.post(
        f"{url}/system/functions",
        auth=auth,
        json={
            "service": "demand",
            "image": "fedfaas-test/slow:0",
            "envVars": {"STARTUP_DELAY_S": "1.5"},
            "labels": {"com.openfaas.scale.min": "1", "com.openfaas.scale.max": "3"},
            "annotations": {"com.fedfaas.handler": str(tmp_path / "slow")},
            "secrets": ["fedfaas-function-token"],
        },
    )
    assert r.status_code == 202, r.text
    node1 = gateways[0].url
    now = [1000.0]

    def load(**kw: float) -> None:
        base = {"endpoints": 2, "free_endpoints": 0, "waiting_slots": 0, "queue": 0.0}
        assert httpx.put(f"{node1}/_standin/aggregators", json={**base, **kw}).status_code == 200

    async def go() -> None:
        coord = Coordinator(
            {g.name: g.url for g in gateways},
            provider=Provider(url, auth),
            function="demand",
            scale_down_after=30.0,
            clock=lambda: now[0],
        )
        await coord.start()
        try:
            async with Provider(url, auth) as p:
                await _available(p, "demand", 1)
                # node1's 2 endpoints are busy and 1 slot waits: one more replica (2 endpoints)
                load(waiting_slots=1)
                await coord.tick()
                assert (coord.last_scale, coord.scale_error) == (2, None)
                st = await p.function("demand")
                assert (st.replicas, st.available_replicas) == (2, 1)
                # it is still starting: the shortage is not answered twice
                await coord.tick()
                assert coord.last_scale == 2 and (await p.function("demand")).replicas == 2
                await _available(p, "demand", 2)
                # five waiting slots would take five more replicas: scale.max is 3
                load(waiting_slots=5)
                await coord.tick()
                assert coord.last_scale == 3
                await _available(p, "demand", 3)
                await coord.tick()  # at the maximum: nothing more is asked
                assert coord.last_scale == 3 and (await p.function("demand")).replicas == 3
                # every node idle: the function stays until scale_down_after has passed
                load(free_endpoints=2)
                await coord.tick()
                now[0] += 29.0
                await coord.tick()
                assert coord.last_scale == 3 and (await p.function("demand")).replicas == 3
                now[0] += 1.0
                await coord.tick()
                assert (coord.last_scale, coord.scale_error) == (1, None)
                await _available(p, "demand", 1)
        finally:
            load(endpoints=0)
            await coord.stop()

    try:
        asyncio.run(go())
    finally:
        httpx.request(
            "DELETE", f"{url}/system/functions", auth=auth, json={"functionName": "demand"}
        )
