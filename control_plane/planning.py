"""Hierarchy planning (LIFL section 5.2): EWMA queue estimates, per-node two-level trees.

Pure: plain data in, frozen dataclasses out.

Shape of a plan. On every node that expects updates there is one *middle* aggregator and
``ceil(n_i / I)`` *leaf* aggregators, each taking at most ``I`` updates (``per_leaf``,
default 2; the last leaf takes the remainder). One *top* aggregator for the job sits on the
node expecting the most updates (ties: first node in the given order) and takes one partial
per active node. So the goals add up: leaf goals on a node sum to that node's expected
updates, a middle's goal is its number of leaves, the top's goal is the number of middles
(one per active node, but for rule 5 of :func:`replan`), and every update is counted by
exactly one leaf.

Ids are stable strings: ``"<node>:leaf:<n>"``, ``"<node>:middle"`` (``"<node>:middle:<g>"``
for a node's later middles, rule 5 below), ``"top"``.

Re-planning mid-round (:func:`replan`) never loses an update already handed to a leaf:

1. a leaf that received ``d > 0`` updates stays, with a goal ``>= d``; a leaf that finished
   (sent its partial) is frozen with its goal;
2. a node's new goal is ``max(expected, delivered on that node)``; the rest is spread over
   the kept partly-filled leaves (up to ``I`` each, lowest leaf number first), then over the
   node's old empty leaves (kept so their routes need not change), then over new leaves with
   fresh numbers; old empty leaves not needed are removed;
3. a node with no expected and no delivered updates loses its leaves and middle;
4. the top stays on its node while that node is active, else moves as in :func:`plan_hierarchy`;
5. a node whose leaves are all frozen has a middle that finished, or will with that goal, so
   it cannot take another child: new leaves on it go under a fresh middle (generation ``g``,
   id ``"<node>:middle:<g>"``), which the top counts as one more partial. A dead root's
   clients moved to nodes whose updates had all arrived land this way.

:func:`diff_plans` lists what changed so routes can be updated in place.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from control_plane.errors import InvalidInput

Role = Literal["leaf", "middle", "top"]
TOP_ID = "top"
DEFAULT_ALPHA = 0.7
DEFAULT_PER_LEAF = 2


def leaf_id(node: str, n: int) -> str:
    """Id of leaf number ``n`` on ``node``."""
    return f"{node}:leaf:{n}"


def middle_id(node: str, generation: int = 0) -> str:
    """Id of the middle aggregator of ``node`` (its ``generation``-th, rule 5 of :func:`replan`)."""
    return f"{node}:middle" if generation == 0 else f"{node}:middle:{generation}"


# --------------------------------------------------------------------------- EWMA


def ewma(previous: float | None, observed: float, alpha: float = DEFAULT_ALPHA) -> float:
    """``Q_t = alpha * Q_{t-1} + (1 - alpha) * x_t``; the first observation is taken as is."""
    if not 0.0 <= alpha <= 1.0:
        raise InvalidInput(f"alpha must be in [0, 1], got {alpha}")
    if observed < 0 or observed != observed:
        raise InvalidInput(f"queue length must be a number >= 0, got {observed}")
    if previous is None:
        return float(observed)
    return alpha * previous + (1.0 - alpha) * float(observed)


@dataclass
class QueueEstimator:
    """Per-node EWMA of the queue length ``Q_i = k_i * E_i`` (alpha = 0.7 as in the paper).

    Examples
    --------
    >>> est = QueueEstimator()
    >>> est.observe({"n1": 10.0})["n1"]
    10.0
    >>> round(est.observe({"n1": 0.0})["n1"], 6)
    7.0
    """

    alpha: float = DEFAULT_ALPHA
    estimates: dict[str, float] = field(default_factory=dict)

    def observe(self, samples: Mapping[str, float]) -> dict[str, float]:
        """Fold one sample per node into the estimates and return all estimates."""
        for node, x in samples.items():
            self.estimates[node] = ewma(self.estimates.get(node), x, self.alpha)
        return dict(self.estimates)

    def forget(self, node: str) -> None:
        """Drop a node (taken out of service)."""
        self.estimates.pop(node, None)

    def expected_updates(self) -> dict[str, int]:
        """Estimates rounded up to whole updates (a fraction of an update still needs a leaf)."""
        return {n: int(-(-q // 1)) if q > 1e-9 else 0 for n, q in self.estimates.items()}


# --------------------------------------------------------------------------- plans


@dataclass(frozen=True)
class AggregatorSpec:
    """One aggregator of a plan (what its TASK message carries)."""

    id: str
    role: Role
    node: str
    goal: int
    parent: str | None


@dataclass(frozen=True)
class NodePlan:
    """The leaves of one node and the middle each reports to.

    ``middles[i]`` is the generation of leaf ``leaf_numbers[i]``'s middle (empty: all 0, the
    node's one middle); a middle's children are the leaves of its generation.
    """

    node: str
    leaf_numbers: tuple[int, ...]
    leaf_goals: tuple[int, ...]
    middles: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not self.middles:
            object.__setattr__(self, "middles", (0,) * len(self.leaf_numbers))
        if not len(self.middles) == len(self.leaf_numbers) == len(self.leaf_goals):
            raise InvalidInput(
                f"node {self.node!r}: leaf numbers, goals and middles differ in length"
            )

    @property
    def expected(self) -> int:
        """Updates this node's leaves will take."""
        return sum(self.leaf_goals)

    def generations(self) -> dict[int, tuple[int, int]]:
        """``{generation: (children, updates)}`` of the node's middles, oldest first."""
        out: dict[int, tuple[int, int]] = {}
        for g, goal in sorted(zip(self.middles, self.leaf_goals, strict=True), key=lambda x: x[0]):
            kids, ups = out.get(g, (0, 0))
            out[g] = (kids + 1, ups + goal)
        return out


@dataclass(frozen=True)
class Plan:
    """A job's aggregation hierarchy for one round (version increases on every re-plan)."""

    version: int
    per_leaf: int
    nodes: tuple[NodePlan, ...]
    top_node: str | None

    @property
    def goal(self) -> int:
        """Total updates the plan aggregates."""
        return sum(n.expected for n in self.nodes)

    @property
    def top_goal(self) -> int:
        """Partials the top waits for: one per middle (one per active node but for rule 5)."""
        return sum(len(n.generations()) for n in self.nodes)

    def node_plan(self, node: str) -> NodePlan | None:
        """The plan of ``node``, or None when it has no aggregators."""
        for n in self.nodes:
            if n.node == node:
                return n
        return None

    def aggregators(self) -> list[AggregatorSpec]:
        """Every aggregator, leaves first, then middles, then the top."""
        out: list[AggregatorSpec] = []
        for n in self.nodes:
            out.extend(
                AggregatorSpec(leaf_id(n.node, k), "leaf", n.node, g, middle_id(n.node, m))
                for k, g, m in zip(n.leaf_numbers, n.leaf_goals, n.middles, strict=True)
            )
        out.extend(
            AggregatorSpec(middle_id(n.node, m), "middle", n.node, kids, TOP_ID)
            for n in self.nodes
            for m, (kids, _) in n.generations().items()
        )
        if self.top_node is not None:
            out.append(AggregatorSpec(TOP_ID, "top", self.top_node, self.top_goal, None))
        return out

    def leaf_for_arrival(self, node: str, j: int) -> str:
        """The leaf that takes the ``j``-th update (0-based) arriving at ``node``.

        Leaves are filled in order, each up to its goal; a re-planned leaf that already holds
        updates counts them first, so callers pass the node's total arrival count.
        """
        n = self.node_plan(node)
        if n is None or j < 0 or j >= n.expected:
            raise InvalidInput(
                f"node {node!r} expects no update number {j} in plan v{self.version}"
            )
        for k, g in zip(n.leaf_numbers, n.leaf_goals, strict=True):
            if j < g:
                return leaf_id(node, k)
            j -= g
        raise AssertionError("unreachable")  # pragma: no cover


def _leaf_goals(n: int, per_leaf: int) -> list[int]:
    full, rest = divmod(n, per_leaf)
    return [per_leaf] * full + ([rest] if rest else [])


def _check(expected: Mapping[str, int], per_leaf: int) -> None:
    if per_leaf < 1:
        raise InvalidInput(f"per_leaf (I) must be >= 1, got {per_leaf}")
    for node, n in expected.items():
        if not isinstance(n, int) or n < 0:
            raise InvalidInput(f"expected updates of node {node!r} must be an int >= 0, got {n!r}")
        if not node or ":" in node:
            raise InvalidInput(f"node names must be non-empty and contain no ':', got {node!r}")


def _pick_top(nodes: Iterable[NodePlan]) -> str | None:
    best: NodePlan | None = None
    for n in nodes:
        if best is None or n.expected > best.expected:
            best = n
    return None if best is None else best.node


def plan_hierarchy(
    expected: Mapping[str, int], per_leaf: int = DEFAULT_PER_LEAF, *, version: int = 0
) -> Plan:
    """Plan a fresh hierarchy from the expected updates per node (insertion order kept).

    Parameters
    ----------
    expected
        Updates each node expects this round (from placement counts or
        :meth:`QueueEstimator.expected_updates`). Nodes with 0 get no aggregators.
    per_leaf
        ``I``: updates per leaf aggregator.
    version
        Plan version to stamp.
    """
    _check(expected, per_leaf)
    nodes = []
    for node, n in expected.items():
        if n > 0:
            goals = _leaf_goals(n, per_leaf)
            nodes.append(NodePlan(node, tuple(range(len(goals))), tuple(goals)))
    return Plan(version, per_leaf, tuple(nodes), _pick_top(nodes))


def replan(
    old: Plan,
    expected: Mapping[str, int],
    delivered: Mapping[str, int] | None = None,
    finished: Iterable[str] = (),
) -> Plan:
    """Re-plan mid-round without losing in-flight updates (rules in the module docstring).

    Parameters
    ----------
    old
        The plan in force.
    expected
        New expected updates per node (nodes missing here expect 0).
    delivered
        Updates already handed to each leaf id (missing: 0).
    finished
        Leaf ids that already sent their partial (frozen).
    """
    delivered = dict(delivered or {})
    _check(expected, old.per_leaf)
    done = set(finished)
    for lid, d in delivered.items():
        if not isinstance(d, int) or d < 0:
            raise InvalidInput(f"delivered count of {lid} must be an int >= 0, got {d!r}")
    I = old.per_leaf  # noqa: E741 - the paper's name
    prev_by_node = {n.node: n for n in old.nodes}
    order = [n.node for n in old.nodes] + [n for n in expected if n not in prev_by_node]
    touched: dict[str, dict[int, int]] = {}
    for lid, d in delivered.items():
        if d:
            node, _, num = lid.rpartition(":leaf:")
            touched.setdefault(node, {})[int(num)] = d
    frozen: dict[str, set[int]] = {}
    for lid in done:
        node, _, num = lid.rpartition(":leaf:")
        frozen.setdefault(node, set()).add(int(num))
    nodes: list[NodePlan] = []
    for node in order:
        prev = prev_by_node.get(node)
        old_nums = () if prev is None else prev.leaf_numbers
        old_mid = {} if prev is None else dict(zip(prev.leaf_numbers, prev.middles, strict=True))
        gen = max(old_mid.values(), default=0)  # the node's newest middle
        got = touched.get(node, {})
        fin = frozen.get(node, set()) | {k for k, m in old_mid.items() if m < gen}  # sealed
        if not got and not fin:  # fast path: nothing in flight on this node
            goals = _leaf_goals(expected.get(node, 0), I)
            if goals:
                nxt = old_nums[-1] + 1 if old_nums else 0
                extra = len(goals) - len(old_nums)
                nums = old_nums[: len(goals)] + tuple(range(nxt, nxt + max(extra, 0)))
                nodes.append(NodePlan(node, nums, tuple(goals), (gen,) * len(goals)))
            continue
        old_goal = (
            {} if prev is None else dict(zip(prev.leaf_numbers, prev.leaf_goals, strict=True))
        )
        got = {k: d for k, d in got.items() if k in old_goal}  # unknown leaves hold nothing here
        here = sum(got.values())
        left = max(expected.get(node, 0), here) - here
        kept: list[tuple[int, int, int]] = []
        for k in sorted(set(got) | (fin & old_goal.keys())):
            d = got.get(k, 0)
            if k in fin:
                kept.append((k, max(old_goal[k], d), old_mid[k]))
            else:
                more = min(max(I - d, 0), left)
                left -= more
                kept.append((k, d + more, old_mid[k]))
        busy = {k for k, *_ in kept}
        empty = [k for k in old_nums if k not in busy]
        goals = _leaf_goals(left, I)
        if goals and old_nums and all(k in fin for k, m in old_mid.items() if m == gen):
            gen += 1  # rule 5: the newest middle takes no more children
        kept.extend((k, g, old_mid[k]) for k, g in zip(empty, goals, strict=False))
        nxt = old_nums[-1] + 1 if old_nums else 0
        kept.extend((nxt + j, g, gen) for j, g in enumerate(goals[len(empty) :]))
        kept.sort()
        if kept:
            nodes.append(NodePlan(node, *(tuple(col) for col in zip(*kept, strict=True))))
    active = {n.node for n in nodes}
    top = old.top_node if old.top_node in active else _pick_top(nodes)
    return Plan(old.version + 1, I, tuple(nodes), top)


@dataclass(frozen=True)
class PlanDiff:
    """What changed from one plan to the next.

    Attributes
    ----------
    added
        Aggregators to create (and route to).
    removed
        Aggregator ids to retire (none of them holds an update, by :func:`replan`'s rules).
    changed
        Aggregators whose goal, node or parent changed: ``(old, new)`` specs; their TASK is
        re-sent with the new goal.
    rerouted
        Aggregators whose parent moved to another node (their partial now crosses nodes or
        stops crossing): the gateways' inter-node routes change for these.
    """

    added: tuple[AggregatorSpec, ...]
    removed: tuple[str, ...]
    changed: tuple[tuple[AggregatorSpec, AggregatorSpec], ...]
    rerouted: tuple[str, ...]

    @property
    def empty(self) -> bool:
        """True when nothing changed."""
        return not (self.added or self.removed or self.changed or self.rerouted)


def diff_plans(old: Plan, new: Plan) -> PlanDiff:
    """Compare two plans; nodes whose leaves did not change cost O(1)."""
    a_nodes = {n.node: n for n in old.nodes}
    b_nodes = {n.node: n for n in new.nodes}
    added: list[AggregatorSpec] = []
    removed: list[str] = []
    changed: list[tuple[AggregatorSpec, AggregatorSpec]] = []
    for node in [*a_nodes, *(n for n in b_nodes if n not in a_nodes)]:
        na, nb = a_nodes.get(node), b_nodes.get(node)
        if na == nb:
            continue
        la = {} if na is None else dict(zip(na.leaf_numbers, na.leaf_goals, strict=True))
        lb = {} if nb is None else dict(zip(nb.leaf_numbers, nb.leaf_goals, strict=True))
        ma = {} if na is None else dict(zip(na.leaf_numbers, na.middles, strict=True))
        mb = {} if nb is None else dict(zip(nb.leaf_numbers, nb.middles, strict=True))
        for k, g in lb.items():
            spec = AggregatorSpec(leaf_id(node, k), "leaf", node, g, middle_id(node, mb[k]))
            if k not in la:
                added.append(spec)
            elif la[k] != g or ma[k] != mb[k]:
                was = AggregatorSpec(spec.id, "leaf", node, la[k], middle_id(node, ma[k]))
                changed.append((was, spec))
        removed.extend(leaf_id(node, k) for k in la if k not in lb)
        ga = {} if na is None else na.generations()
        gb = {} if nb is None else nb.generations()
        for m, (kids, _) in gb.items():
            spec = AggregatorSpec(middle_id(node, m), "middle", node, kids, TOP_ID)
            if m not in ga:
                added.append(spec)
            elif ga[m][0] != kids:
                changed.append((AggregatorSpec(spec.id, "middle", node, ga[m][0], TOP_ID), spec))
        removed.extend(middle_id(node, m) for m in ga if m not in gb)
    ta = (
        None
        if old.top_node is None
        else AggregatorSpec(TOP_ID, "top", old.top_node, old.top_goal, None)
    )
    tb = (
        None
        if new.top_node is None
        else AggregatorSpec(TOP_ID, "top", new.top_node, new.top_goal, None)
    )
    if ta is None and tb is not None:
        added.append(tb)
    elif tb is None and ta is not None:
        removed.append(TOP_ID)
    elif ta is not None and tb is not None and ta != tb:
        changed.append((ta, tb))
    rerouted: tuple[str, ...] = ()
    if ta is not None and tb is not None and ta.node != tb.node:
        rerouted = tuple(
            middle_id(n, m) for n, p in b_nodes.items() if n in a_nodes for m in p.generations()
        )
    return PlanDiff(tuple(added), tuple(removed), tuple(changed), rerouted)
