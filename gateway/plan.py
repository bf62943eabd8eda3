"""The aggregation plan of one round: which aggregator slots exist, where, and who feeds whom.

The control plane (issue 5) replaces :func:`static_plan` through the ``Planner`` callable the
gateway takes; everything else only reads a :class:`Plan`. Pure data, no I/O.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

LEAF, MIDDLE, TOP = 1, 2, 3
#: what a client id may be (jobs' client lists, plans' assignments)
CLIENT_ID = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


@dataclass(frozen=True, slots=True)
class Slot:
    """One aggregator task of a round.

    ``goal`` counts client updates covered by the slot's subtree; ``parent`` is the parent
    slot id (None for the top, which reports to its gateway).
    """

    id: int
    node: str
    role: int
    goal: int
    parent: int | None


@dataclass(frozen=True)
class Plan:
    """Slots of a round plus an optional client -> leaf-slot assignment.

    ``excluded``: clients the control plane dropped before aggregation (FLStore flagged them
    in an earlier round), each with why (``{"flagged_in": round, "workload": name}``): their
    uploads are refused and the round's ``meta.json`` records them."""

    slots: tuple[Slot, ...]
    assignment: dict[str, int] = field(default_factory=dict)
    client_nodes: dict[str, str] = field(default_factory=dict)
    excluded: dict[str, dict[str, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        ids = [s.id for s in self.slots]
        if len(set(ids)) != len(ids) or any(i <= 0 for i in ids):
            raise ValueError("slot ids must be unique and positive")
        tops = [s for s in self.slots if s.parent is None]
        if len(tops) != 1 or tops[0].role != TOP:
            raise ValueError("a plan has exactly one top slot")
        by_id = self.by_id()
        for s in self.slots:
            kids = self.children(s.id)
            if s.parent is not None and s.parent not in by_id:
                raise ValueError(f"slot {s.id}: unknown parent {s.parent}")
            if kids and sum(by_id[k].goal for k in kids) != s.goal:
                raise ValueError(f"slot {s.id}: goal {s.goal} differs from its children's sum")
            if kids and s.role == LEAF:
                raise ValueError(f"slot {s.id}: a leaf (role 1) cannot have children")
            if s.goal < 1:
                raise ValueError(f"slot {s.id}: goal must be >= 1, got {s.goal}")
        for s in self.slots:  # every slot must reach the top: no cycles, no detached subtrees
            seen: set[int] = set()
            cur: Slot | None = s
            while cur is not None and cur.parent is not None:
                if cur.id in seen:
                    raise ValueError(f"slot {s.id}: its parents form a cycle")
                seen.add(cur.id)
                cur = by_id.get(cur.parent)

    def by_id(self) -> dict[int, Slot]:
        return {s.id: s for s in self.slots}

    @property
    def top(self) -> Slot:
        return next(s for s in self.slots if s.parent is None)

    @property
    def goal(self) -> int:
        return self.top.goal

    def children(self, slot_id: int) -> list[int]:
        return [s.id for s in self.slots if s.parent == slot_id]

    def intake(self, node: str) -> list[Slot]:
        """Slots on ``node`` that take client updates (slots without children), in id order."""
        return [s for s in self.slots if s.node == node and not self.children(s.id)]

    def node_goal(self, node: str) -> int:
        return sum(s.goal for s in self.intake(node))

    def to_json(self) -> dict[str, object]:
        return {
            "slots": [
                {"id": s.id, "node": s.node, "role": s.role, "goal": s.goal, "parent": s.parent}
                for s in self.slots
            ],
            "client_nodes": self.client_nodes,
            **({"excluded": self.excluded} if self.excluded else {}),
        }


Planner = Callable[[int, Sequence[str], Sequence[str]], Plan]
"""``planner(goal, clients, nodes) -> Plan``; nodes[0] hosts the top."""


def _split(total: int, parts: int) -> list[int]:
    q, r = divmod(total, parts)
    return [q + (1 if i < r else 0) for i in range(parts)]


def static_plan(goal: int, clients: Sequence[str], nodes: Sequence[str], fanout: int = 2) -> Plan:
    """ceil(g/I) leaves of at most ``fanout`` updates per node under one top on ``nodes[0]``.

    Other nodes get a middle slot gathering their leaves, so one partial per node crosses
    nodes. Clients are split over nodes in contiguous blocks. One node with ``goal <= fanout``
    is a lone top.
    """
    if goal < 1 or fanout < 1 or not nodes:
        raise ValueError("goal and fanout must be >= 1 and there must be a node")
    nodes = list(nodes)
    goals = [g for g in _split(goal, len(nodes))]
    if len(nodes) == 1 and goal <= fanout:
        return Plan(
            (Slot(1, nodes[0], TOP, goal, None),), client_nodes=_client_nodes(clients, nodes)
        )
    slots = [Slot(1, nodes[0], TOP, goal, None)]
    next_id = 2
    for i, (node, g) in enumerate(zip(nodes, goals, strict=True)):
        if g == 0:
            continue
        parent = 1
        if i > 0:
            slots.append(Slot(next_id, node, MIDDLE, g, 1))
            parent = next_id
            next_id += 1
        for lg in _split(g, math.ceil(g / fanout)):
            slots.append(Slot(next_id, node, LEAF, lg, parent))
            next_id += 1
    return Plan(tuple(slots), client_nodes=_client_nodes(clients, nodes))


def _client_nodes(clients: Sequence[str], nodes: Sequence[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    sizes = _split(len(clients), len(nodes))
    pos = 0
    for node, n in zip(nodes, sizes, strict=True):
        for c in clients[pos : pos + n]:
            out[c] = node
        pos += n
    return out
