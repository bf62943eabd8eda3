"""A node leaves placement only after failing its probes for the grace period: a gateway
that restarts (the supervisor or a kubelet starts it again in a second or two) keeps its place
and its rounds (issue 13). Pure logic: a fake clock and fake probe answers."""

from __future__ import annotations

import asyncio
from typing import Any

from control_plane.coordinator import Coordinator


def _coordinator(grace: float, now: list[float]) -> tuple[Coordinator, dict[str, bool]]:
    coord = Coordinator(
        {"n1": "http://n1", "n2": "http://n2"},
        health_failures=2,
        node_grace_s=grace,
        clock=lambda: now[0],
    )
    up = {"n1": True, "n2": True}
    for name, client in coord.clients.items():

        async def healthz(name: str = name) -> dict[str, Any] | None:
            return {"node": name} if up[name] else None

        client.healthz = healthz  # type: ignore[method-assign]
    return coord, up


def test_a_node_down_for_less_than_the_grace_keeps_its_place() -> None:
    now = [100.0]
    coord, up = _coordinator(10.0, now)
    up["n2"] = False
    for _ in range(5):  # five failed probes in 4 s: past health_failures, inside the grace
        asyncio.run(coord.check_health())
        now[0] += 1.0
    assert coord.nodes["n2"].healthy and coord.nodes["n2"].failures == 5
    up["n2"] = True  # restarted
    asyncio.run(coord.check_health())
    assert coord.nodes["n2"].healthy and coord.nodes["n2"].failing_since is None


def test_a_node_down_past_the_grace_leaves_placement() -> None:
    now = [100.0]
    coord, up = _coordinator(10.0, now)
    up["n2"] = False
    asyncio.run(coord.check_health())
    now[0] += 9.9
    asyncio.run(coord.check_health())
    assert coord.nodes["n2"].healthy, "9.9 s of failures: still inside the grace"
    now[0] += 0.2
    asyncio.run(coord.check_health())
    assert not coord.nodes["n2"].healthy and coord.healthy_nodes() == ["n1"]


def test_without_a_grace_the_failure_count_alone_decides() -> None:
    now = [0.0]
    coord, up = _coordinator(0.0, now)
    up["n1"] = False
    asyncio.run(coord.check_health())
    assert coord.nodes["n1"].healthy
    asyncio.run(coord.check_health())
    assert not coord.nodes["n1"].healthy
