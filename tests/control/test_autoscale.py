"""The autoscaler's arithmetic (control_plane.autoscale), pure; and how a gateway's
``/healthz`` becomes its input (control_plane.coordinator.node_load)."""

from __future__ import annotations

import itertools

import pytest

from control_plane.autoscale import NodeLoad, ScaleBounds, replicas_wanted
from control_plane.scaling import node_load

BOUNDS = ScaleBounds(1, 20)


def wanted(
    loads: list[NodeLoad],
    desired: int = 1,
    available: int | None = None,
    per: int = 2,
    bounds: ScaleBounds = BOUNDS,
    idle_for_s: float = 0.0,
) -> int:
    """``replicas_wanted`` with every replica asked for ready unless ``available`` says not."""
    return replicas_wanted(
        loads,
        desired=desired,
        available=desired if available is None else available,
        endpoints_per_replica=per,
        bounds=bounds,
        idle_for_s=idle_for_s,
        idle_s=30.0,
    )


def busy(
    node: str = "a", endpoints: int = 2, waiting_slots: int = 0, queue: float = 0.0
) -> NodeLoad:
    """A node whose endpoints are all taken."""
    return NodeLoad(node, endpoints, 0, waiting_slots, queue)


def idle(node: str = "a", endpoints: int = 2) -> NodeLoad:
    return NodeLoad(node, endpoints, endpoints, 0)


def reference_shortage(endpoints: int, waiting: int, queue: float) -> int:
    """The fewest extra endpoints that seat every waiting slot and run the queue at once."""
    extra = 0
    while extra < waiting or endpoints + extra < queue - 1e-9:
        extra += 1
    return extra


# ------------------------------------------------------------------------------ shortage
def test_waiting_slots_are_the_shortage_whatever_the_endpoints():
    assert busy(endpoints=2, waiting_slots=3).shortage == 3
    assert busy(endpoints=0, waiting_slots=1).shortage == 1
    assert busy(endpoints=8, waiting_slots=0).shortage == 0


def test_a_queue_longer_than_the_endpoints_is_a_shortage_of_the_difference_rounded_up():
    assert busy(endpoints=2, waiting_slots=0, queue=4.5).shortage == 3
    assert busy(endpoints=2, waiting_slots=0, queue=2.0).shortage == 0  # exactly covered
    assert busy(endpoints=2, waiting_slots=0, queue=2.0 + 1e-12).shortage == 0  # float noise
    assert busy(endpoints=4, waiting_slots=0, queue=1.5).shortage == 0
    assert busy(endpoints=0, waiting_slots=0, queue=0.2).shortage == 1


def test_waiting_slots_and_queue_do_not_add_up_the_larger_need_counts():
    assert busy(endpoints=2, waiting_slots=1, queue=5.0).shortage == 3
    assert busy(endpoints=2, waiting_slots=4, queue=3.0).shortage == 4


def test_shortage_agrees_with_the_brute_force_reference():
    for endpoints, waiting, q10 in itertools.product(range(5), range(5), range(0, 80, 3)):
        queue = q10 / 10
        got = NodeLoad("a", endpoints, 0, waiting, queue).shortage
        assert got == reference_shortage(endpoints, waiting, queue), (endpoints, waiting, queue)


# ------------------------------------------------------------------------------ scaling up
def test_a_node_short_by_waiting_slots_gets_enough_replicas_for_them():
    # 3 waiting slots, 2 endpoints per replica: 2 more replicas
    assert wanted([busy(waiting_slots=3)], desired=2, per=2) == 4
    assert wanted([busy(waiting_slots=3)], desired=2, per=1) == 5


def test_a_node_short_by_its_queue_gets_enough_replicas_for_it():
    # queue 5.2 on 2 endpoints: 4 missing, 2 replicas of 2
    assert wanted([busy(waiting_slots=0, queue=5.2)], desired=1, per=2) == 3


def test_the_shortages_of_all_nodes_add_up():
    loads = [busy("a", waiting_slots=1), busy("b", waiting_slots=2), idle("c")]
    assert wanted(loads, desired=3, per=1) == 6
    assert wanted(loads, desired=3, per=2) == 5  # ceil(3 / 2)


def test_nothing_more_is_asked_while_a_scale_up_is_still_starting():
    assert wanted([busy(waiting_slots=4)], desired=3, available=2) == 3
    assert wanted([busy(waiting_slots=4)], desired=3, available=3) == 5


def test_zero_endpoints_per_replica_counts_as_one():
    assert wanted([busy(waiting_slots=2)], desired=1, per=0) == 3


# ------------------------------------------------------------------------------ bounds
def test_scaling_up_stops_at_the_maximum():
    bounds = ScaleBounds(1, 4)
    assert wanted([busy(waiting_slots=10)], desired=2, per=1, bounds=bounds) == 4
    assert wanted([busy(waiting_slots=1)], desired=4, per=1, bounds=bounds) == 4


def test_scaling_up_never_goes_below_the_minimum():
    assert wanted([busy(waiting_slots=1)], desired=1, per=1, bounds=ScaleBounds(5, 10)) == 5


# ------------------------------------------------------------------------------ idle
@pytest.mark.parametrize("idle_for_s, want", [(0.0, 6), (29.9, 6), (30.0, 2), (300.0, 2)])
def test_all_nodes_idle_for_idle_s_scale_down_to_the_minimum(idle_for_s, want):
    loads = [idle("a"), idle("b", 4), NodeLoad("c", 0, 0, 0)]
    assert wanted(loads, desired=6, bounds=ScaleBounds(2, 20), idle_for_s=idle_for_s) == want


def test_idle_scale_down_keeps_one_replica_even_with_a_zero_minimum():
    assert wanted([idle()], desired=3, bounds=ScaleBounds(0, 20), idle_for_s=60) == 1


@pytest.mark.parametrize(
    "load",
    [
        NodeLoad("b", 2, 1, 0),  # one endpoint busy
        NodeLoad("b", 2, 2, 0, queue=0.4),  # work expected
    ],
    ids=["busy-endpoint", "queue"],
)
def test_one_node_not_idle_keeps_the_replicas(load):
    assert not load.idle and load.shortage == 0
    assert wanted([idle("a"), load], desired=4, idle_for_s=600) == 4


def test_no_report_at_all_changes_nothing():
    assert wanted([], desired=4, idle_for_s=600) == 4


def test_a_node_with_waiting_slots_is_not_idle():
    load = NodeLoad("a", 2, 2, 1)
    assert not load.idle


# ------------------------------------------------------------------------------ input
def test_node_load_reads_the_aggregators_block_of_healthz():
    body = {
        "status": "ok",
        "aggregators": {"endpoints": 4, "free_endpoints": 1, "waiting_slots": 2, "queue": 3.5},
    }
    assert node_load("n1", body) == NodeLoad("n1", 4, 1, 2, 3.5)


@pytest.mark.parametrize(
    "body",
    [{"status": "ok"}, {"aggregators": None}, {"aggregators": {"endpoints": "x", "queue": None}}],
    ids=["absent", "null", "garbage"],
)
def test_node_load_of_a_gateway_without_a_readable_block_is_zero(body):
    assert node_load("n1", body) == NodeLoad("n1", 0, 0, 0, 0.0)


@pytest.mark.parametrize(
    ("env", "per"),
    [
        ({"FEDFAAS_AGGREGATOR_ENDPOINTS": "4"}, 4),
        ({}, 2),
        ({"FEDFAAS_AGGREGATOR_ENDPOINTS": "x"}, 2),
    ],
    ids=["deployed", "default", "garbage"],
)
def test_endpoints_per_replica_come_from_the_deployed_function(env, per):
    from control_plane.scaling import endpoints_per_replica
    from core.openfaas import FunctionStatus

    st = FunctionStatus.from_json({"name": "aggregator", "replicas": 1, "envVars": env}, "x")
    assert endpoints_per_replica(st) == per


def test_a_tick_without_any_gateway_report_is_not_idle_time():
    """Gateways that do not answer give no evidence of idling: the scale-down clock restarts."""
    import asyncio

    from control_plane.coordinator import Coordinator

    now = [100.0]

    class Provider:
        scaled: list[int] = []

        async def function(self, name):  # type: ignore[no-untyped-def]
            from core.openfaas import FunctionStatus

            return FunctionStatus(name, 3, 3, {"com.openfaas.scale.min": "1"})

        async def scale(self, name, n):  # type: ignore[no-untyped-def]
            self.scaled.append(n)

    prov = Provider()
    coord = Coordinator({"a": "http://127.0.0.1:9"}, provider=prov, clock=lambda: now[0])  # type: ignore[arg-type]
    idle_a = {"a": {"aggregators": {"endpoints": 2, "free_endpoints": 2}}}

    async def go() -> None:
        await coord.autoscale(idle_a)
        now[0] += 20
        await coord.autoscale({})  # no gateway answered
        now[0] += 20
        await coord.autoscale(idle_a)  # idle for 20 s since the silence, not 40
        assert prov.scaled == []
        now[0] += 15
        await coord.autoscale(idle_a)
        assert prov.scaled == [1]

    asyncio.run(go())
