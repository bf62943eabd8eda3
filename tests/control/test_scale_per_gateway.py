"""Each gateway's shortage scales the function that serves it (control_plane.scaling).

The chart's ``nodeGateway.perNode`` runs a second gateway on a machine as node ``<node>-1``,
served by the function ``aggregator-1`` (charts/fedfaas aggregator.yaml): its shortage must
scale ``aggregator-1``; replicas of ``aggregator`` register with the first gateway's router and
never serve it. The provider of the first tests is a fake (the logic only); the last one runs
the real embedded runtime with two functions and two gateway processes probed by the
control plane's ticks.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from control_plane.coordinator import Coordinator
from control_plane.scaling import gateway_function
from core.openfaas import AsyncOpenFaaS as OpenFaaSProvider
from core.openfaas import FunctionStatus, OpenFaaSError, read_basic_auth
from runtime import RuntimeProcess

ROOT = Path(__file__).resolve().parents[2]

GATEWAYS = {"n": "http://127.0.0.1:9", "n-1": "http://127.0.0.1:9"}


class Provider:
    """Functions by name with their replicas (all ready); records every scale asked."""

    def __init__(self, replicas: dict[str, int], broken: frozenset[str] = frozenset()) -> None:
        self.replicas = dict(replicas)
        self.broken = broken
        self.scaled: list[tuple[str, int]] = []

    async def function(self, name: str) -> FunctionStatus | None:
        if name in self.broken:
            raise OpenFaaSError(f"GET /system/function/{name}: answered 500", 500)
        if name not in self.replicas:
            return None
        n = self.replicas[name]
        labels = {"com.openfaas.scale.min": "1", "com.openfaas.scale.max": "10"}
        return FunctionStatus(name, n, n, labels)

    async def scale(self, name: str, replicas: int) -> None:
        self.scaled.append((name, replicas))
        self.replicas[name] = replicas


def report(endpoints: int = 2, free: int = 0, waiting: int = 0) -> dict[str, Any]:
    return {
        "aggregators": {"endpoints": endpoints, "free_endpoints": free, "waiting_slots": waiting}
    }


IDLE = report(free=2)


def tick(provider: Provider, reports: dict[str, dict[str, Any]], **kw: Any) -> Coordinator:
    coord = Coordinator(GATEWAYS, provider=provider, **kw)  # type: ignore[arg-type]
    asyncio.run(coord.autoscale(reports))
    return coord


@pytest.mark.parametrize(
    ("node", "function"),
    [
        ("n", "aggregator"),
        ("n-1", "aggregator-1"),
        ("n-3", "aggregator-3"),
        ("n-1-1", "aggregator-1"),  # the second gateway of a machine named n-1
        ("m-1", "aggregator"),  # no gateway m: a machine named m-1, its first gateway
        ("n-0", "aggregator"),
        ("n-01", "aggregator"),
        ("node0", "aggregator"),
    ],
)
def test_the_function_of_a_gateway_follows_the_charts_names(node: str, function: str) -> None:
    nodes = {*GATEWAYS, "n-1-1", "m-1", "n-3", "node0"}
    assert gateway_function(node, nodes, "aggregator") == function


def test_a_shortage_on_the_second_gateway_scales_its_own_function_only() -> None:
    prov = Provider({"aggregator": 1, "aggregator-1": 1})
    coord = tick(prov, {"n": IDLE, "n-1": report(waiting=3)})
    assert prov.scaled == [("aggregator-1", 3)]  # 3 slots, 2 endpoints a replica: 2 more
    assert (coord.last_scale, coord.scale_error, coord.scale_failures) == (1, None, 0)


def test_shortages_on_both_gateways_scale_each_function_by_its_own() -> None:
    prov = Provider({"aggregator": 1, "aggregator-1": 2})
    coord = tick(prov, {"n": report(waiting=1), "n-1": report(waiting=4)})
    assert sorted(prov.scaled) == [("aggregator", 2), ("aggregator-1", 4)]
    assert coord.last_scale == 2


def test_without_the_second_function_the_first_serves_every_gateway() -> None:
    prov = Provider({"aggregator": 1})
    coord = tick(prov, {"n": report(waiting=1), "n-1": report(waiting=1)})
    assert prov.scaled == [("aggregator", 2)]
    assert (coord.last_scale, coord.scale_error) == (2, None)


def test_a_function_whose_status_fails_is_not_scaled_and_the_other_still_is() -> None:
    prov = Provider({"aggregator": 1, "aggregator-1": 1}, broken=frozenset({"aggregator-1"}))
    coord = tick(prov, {"n": report(waiting=2), "n-1": report(waiting=6)})
    assert prov.scaled == [("aggregator", 2)]  # n's 2 slots only, n-1's 6 not added to it
    assert coord.scale_failures == 1
    assert coord.scale_error is not None and "aggregator-1" in coord.scale_error


def test_every_function_scales_down_once_every_gateway_was_idle() -> None:
    now = [100.0]
    prov = Provider({"aggregator": 3, "aggregator-1": 4})
    coord = Coordinator(GATEWAYS, provider=prov, clock=lambda: now[0])  # type: ignore[arg-type]

    async def go() -> None:
        await coord.autoscale({"n": IDLE, "n-1": report(free=1)})  # n-1 busy: the clock restarts
        now[0] += 29
        await coord.autoscale({"n": IDLE, "n-1": IDLE})
        assert prov.scaled == []  # idle for 29 s of the 30
        now[0] += 1
        await coord.autoscale({"n": IDLE, "n-1": IDLE})
        assert sorted(prov.scaled) == [("aggregator", 1), ("aggregator-1", 1)]

    asyncio.run(go())


# ------------------------------------------------------------------- on real processes
@pytest.fixture(scope="module")
def two_functions(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """The real embedded runtime serving ``demand`` and ``demand-1`` (one replica each, at
    most 3): the first and second gateways' functions of a node, as the chart names them."""
    d = tmp_path_factory.mktemp("runtime")
    (d / "handler").mkdir()
    (d / "handler" / "handler.py").write_text(
        "def handle(event, context):\n    return {'statusCode': 200, 'body': 'ok'}\n"
    )
    rt = RuntimeProcess(stack=ROOT / "stack.yml", state_dir=d / "state")
    rt.start(60)
    try:
        secret = {"name": "fedfaas-function-token", "value": "scale-test-token"}
        r = httpx.post(f"{rt.url}/system/secrets", auth=rt.auth, json=secret)
        assert r.status_code == 202, r.text
        for name in ("demand", "demand-1"):
            r = httpx.post(
                f"{rt.url}/system/functions",
                auth=rt.auth,
                json={
                    "service": name,
                    "image": "fedfaas-test/demand:0",
                    "labels": {"com.openfaas.scale.min": "1", "com.openfaas.scale.max": "3"},
                    "annotations": {"com.fedfaas.handler": str(d / "handler")},
                    "secrets": ["fedfaas-function-token"],
                },
            )
            assert r.status_code == 202, r.text
        yield rt.url, rt.auth_dir
    finally:
        rt.stop()


async def _replicas(p: OpenFaaSProvider, name: str, n: int) -> None:
    """Until ``name`` has ``n`` replicas asked for and ready (AssertionError after 60 s)."""
    for _ in range(600):
        st = await p.function(name)
        if st is not None and st.replicas == n and st.available_replicas == n:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"{name} never reached {n} available replicas: {st}")


@pytest.mark.slow  # a runtime and its replicas: `make test-slow`
@pytest.mark.integration
def test_the_second_gateways_shortage_scales_its_function_in_the_real_runtime(
    two_functions: tuple[str, Path], gateways: list[Any]
) -> None:
    """Two gateway processes as ``node1`` and ``node1-1`` (the chart's first and second
    gateway of a machine), the control plane's ticks probing them: a slot waiting on
    ``node1-1`` starts a replica of ``demand-1``, not of ``demand``; once both are idle for
    ``scale_down_after`` both functions are back at their minimum."""
    url, auth_dir = two_functions
    auth = read_basic_auth(auth_dir)
    first, second = gateways[0], gateways[1]
    now = [1000.0]

    def load(gw: Any, **kw: float) -> None:
        base = {"endpoints": 2, "free_endpoints": 2, "waiting_slots": 0, "queue": 0.0}
        r = httpx.put(f"{gw.url}/_standin/aggregators", json={**base, **kw})
        assert r.status_code == 200, r.text

    async def go() -> None:
        coord = Coordinator(
            {"node1": first.url, "node1-1": second.url},
            provider=OpenFaaSProvider(url, auth),
            function="demand",
            clock=lambda: now[0],
        )
        await coord.start()
        try:
            async with OpenFaaSProvider(url, auth) as p:
                await _replicas(p, "demand", 1)
                await _replicas(p, "demand-1", 1)
                load(first)
                load(second, free_endpoints=0, waiting_slots=1)
                await coord.tick()
                await _replicas(p, "demand-1", 2)
                assert (await p.function("demand")).replicas == 1  # type: ignore[union-attr]
                assert (coord.last_scale, coord.scale_error) == (1, None)
                load(second)  # the new replica's endpoints took the slot
                await coord.tick()
                now[0] += 30.0
                await coord.tick()
                await _replicas(p, "demand-1", 1)
                await _replicas(p, "demand", 1)
        finally:
            load(first, endpoints=0, free_endpoints=0)
            load(second, endpoints=0, free_endpoints=0)
            await coord.stop()

    asyncio.run(go())
