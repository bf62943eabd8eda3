"""Plans pushed by the control plane, and closing a round at what arrived. Pure, no I/O.

:func:`plan_from_json` checks a slot table sent with ``PUT /v1/jobs/{job}/rounds/{r}/plan``
(the shape of :meth:`gateway.plan.Plan.to_json` and of ``control_plane.gateways.plan_to_slots``)
against the job: known nodes and clients, one top on the job's root node, goals adding up, no
cycles. :func:`shrink_plan` lowers a round's goals to the updates that reached each node
(``POST /v1/jobs/{job}/rounds/{r}/close``): intake slots keep exactly what they hold, slots
left empty disappear, parents' goals are their children's sums; a remote subtree whose partial
already arrived keeps its goals.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

from gateway.errors import GatewayError
from gateway.plan import CLIENT_ID, TOP, Plan, Slot


class PlanInvalid(GatewayError):
    """A pushed plan that cannot run (422 ``bad_plan``)."""

    status = 422
    code = "bad_plan"


class PlanConflict(GatewayError):
    """A plan or close that would lose or re-route updates already in the round (409)."""

    status = 409
    code = "plan_conflict"


def _int(v: Any, what: str, *, positive: bool = True) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or (positive and v < 1):
        raise PlanInvalid(f"{what} must be an integer >= 1, got {v!r}")
    return v


def plan_from_json(
    data: Any, *, nodes: Sequence[str], root: str, clients: Collection[str]
) -> tuple[Plan, int | None]:
    """Build and check a pushed plan; returns ``(plan, version)``.

    Raises
    ------
    PlanInvalid
        Naming the first problem: shape, unknown node or client, goals, cycle, top placement.
    """
    if not isinstance(data, dict) or not isinstance(data.get("slots"), list) or not data["slots"]:
        raise PlanInvalid('body must be {"slots": [{id, node, role, goal, parent}, ...], ...}')
    slots = []
    for raw in data["slots"]:
        if not isinstance(raw, dict):
            raise PlanInvalid(f"each slot must be an object, got {raw!r:.60}")
        sid = _int(raw.get("id"), "slot id")
        node = raw.get("node")
        if node not in nodes:
            raise PlanInvalid(
                f"slot {sid}: unknown node {node!r}; this job runs on {', '.join(nodes)}"
            )
        role = raw.get("role")
        if role not in (1, 2, 3):
            raise PlanInvalid(f"slot {sid}: role must be 1 (leaf), 2 (middle) or 3 (top)")
        parent = raw.get("parent")
        if parent is not None:
            parent = _int(parent, f"slot {sid}: parent")
        slots.append(
            Slot(sid, str(node), int(role), _int(raw.get("goal"), f"slot {sid}: goal"), parent)
        )
    cn = data.get("client_nodes") or {}
    if not isinstance(cn, dict):
        raise PlanInvalid("client_nodes must map client ids to node names")
    for c, n in cn.items():
        if c not in clients:
            raise PlanInvalid(f"client_nodes: {c!r} is not a client of this job")
        if n not in nodes:
            raise PlanInvalid(f"client_nodes: client {c!r} on unknown node {n!r}")
    excluded = data.get("excluded") or {}
    if not isinstance(excluded, dict) or not all(
        isinstance(c, str) and CLIENT_ID.match(c) and isinstance(why, dict)
        for c, why in excluded.items()
    ):
        raise PlanInvalid('excluded must map client ids to why: {"c7": {"flagged_in": 2, ...}}')
    try:
        plan = Plan(
            tuple(slots),
            client_nodes={str(k): str(v) for k, v in cn.items()},
            excluded={c: dict(why) for c, why in excluded.items()},
        )
    except ValueError as exc:
        raise PlanInvalid(str(exc)) from None
    if plan.top.role != TOP or plan.top.node != root:
        raise PlanInvalid(
            f"the top slot must have role 3 and run on the job's root node {root!r} "
            "(the node that publishes the model)"
        )
    if plan.goal > len(clients):
        raise PlanInvalid(
            f"goal mismatch: top goal {plan.goal} exceeds the job's {len(clients)} clients"
        )
    version = data.get("version")
    return plan, version if isinstance(version, int) and not isinstance(version, bool) else None


def shrink_plan(
    plan: Plan,
    node: str,
    *,
    local_held: Mapping[int, int],
    remote_done: Collection[int],
    received: Mapping[str, int],
) -> Plan:
    """The plan with every goal lowered to the updates that reached each node.

    Parameters
    ----------
    plan
        The round's plan.
    node
        This node: its intake slots get exactly ``local_held[slot]`` updates.
    local_held
        Updates routed to each local intake slot.
    remote_done
        Remote slots whose partial already arrived here: their subtree keeps its goals.
    received
        Updates accepted per other node (missing: 0, e.g. a node that died); filled into that
        node's intake slots in slot order (that node computes its own slots exactly).

    Raises
    ------
    PlanConflict
        When nothing at all would be aggregated.
    """
    by_id = plan.by_id()
    kids: dict[int, list[int]] = {s.id: [] for s in plan.slots}
    for s in plan.slots:
        if s.parent is not None:
            kids[s.parent].append(s.id)
    left = {n: max(0, int(c)) for n, c in received.items() if n != node}
    goal: dict[int, int] = {}

    def visit(sid: int) -> int:
        s = by_id[sid]
        if s.node != node and sid in remote_done:
            keep = [sid]
            while keep:  # the whole subtree keeps its goals (its partial is here already)
                x = keep.pop()
                goal[x] = by_id[x].goal
                keep.extend(kids[x])
            return s.goal
        if not kids[sid]:
            if s.node == node:
                g = int(local_held.get(sid, 0))
            else:
                g = min(s.goal, left.get(s.node, 0))
                left[s.node] = left.get(s.node, 0) - g
        else:
            g = sum(visit(k) for k in sorted(kids[sid]))
        goal[sid] = g
        return g

    total = visit(plan.top.id)
    if total < 1:
        raise PlanConflict("no update reached the surviving nodes: nothing to aggregate")
    kept = tuple(
        Slot(s.id, s.node, s.role, goal[s.id], s.parent)
        for s in plan.slots
        if goal.get(s.id, 0) > 0
    )
    return Plan(kept, dict(plan.assignment), dict(plan.client_nodes), dict(plan.excluded))
