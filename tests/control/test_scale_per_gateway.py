"""Each gateway's shortage scales the function that serves it (control_plane.scaling).

The chart's ``nodeGateway.perNode`` runs a second gateway on a machine as node ``<node>-1``,
served by the function ``aggregator-1`` (charts/fedfaas aggregator.yaml): its shortage must
scale ``aggregator-1``; replicas of ``aggregator`` register with the first gateway's router and
never serve it. The provider here is a fake (the logic only); tests/control/test_provider.py
scales a function of the embedded runtime from stand-in gateways' reports.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from control_plane.coordinator import Coordinator
from control_plane.scaling import gateway_function
from core.openfaas import FunctionStatus, OpenFaaSError

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
