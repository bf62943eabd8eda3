"""Opportunistic reuse of warm aggregator replicas (LIFL section 5.3). Pure.

Aggregator replicas are homogeneous and stateless between tasks, so a role is just the TASK
a replica was last given. :func:`assign_replicas` maps a plan plus what is known about the
running aggregators and replicas to the bindings to make now:

with ``reuse=True``
    * a leaf takes an idle warm replica on its node (lowest replica id first); only when none
      is idle does it need a new one;
    * a node's middle is the replica of the *first leaf on that node that finished* (it holds
      its own partial already, so that partial never moves); before any leaf finishes, the
      middle is *deferred*, not started: no new replica;
    * the top is the replica of the *first middle that finished*, wherever it is; deferred
      until then.
with ``reuse=False`` (the baseline)
    every aggregator not yet bound gets a new replica on its node.

"First" is by completion sequence number, then by id, so the result is deterministic.

The tree is read from the aggregators' parent links, so the same rules serve the control
plane's :class:`~control_plane.planning.Plan` and the node gateway's slot tables (the gateway
calls :func:`assign_replicas` each time a slot of an open round needs an endpoint).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from control_plane.planning import TOP_ID, AggregatorSpec, Plan

Status = Literal["pending", "running", "done"]


@dataclass(frozen=True)
class AggregatorState:
    """Runtime state of one planned aggregator.

    Attributes
    ----------
    status
        ``pending`` (not started), ``running`` or ``done`` (partial sent / model published).
    replica
        Replica bound to it, if any.
    done_seq
        Completion order (smaller finished earlier); set when ``status == "done"``.
    """

    status: Status = "pending"
    replica: str | None = None
    done_seq: int | None = None


@dataclass(frozen=True)
class ReplicaState:
    """One warm replica of the aggregator function on a node.

    ``rank`` orders idle replicas before their id (smaller first): the gateway ranks an
    endpoint already granted the job before one in no job, and that before one of another job.
    """

    id: str
    node: str
    idle: bool
    rank: int = 0


@dataclass(frozen=True)
class ReplicaAssignment:
    """Bindings to make now.

    Attributes
    ----------
    bind
        Aggregator id -> existing replica id (no cold start).
    new
        Aggregator id -> node where a new replica must be started (cold start).
    deferred
        Aggregators that wait for a reusable replica (a leaf or middle to finish).
    """

    bind: dict[str, str] = field(default_factory=dict)
    new: dict[str, str] = field(default_factory=dict)
    deferred: tuple[str, ...] = ()

    def new_replicas(self) -> dict[str, int]:
        """Number of new replicas needed per node."""
        out: dict[str, int] = {}
        for node in self.new.values():
            out[node] = out.get(node, 0) + 1
        return out


def assign_replicas(
    plan: Plan | Sequence[AggregatorSpec],
    states: Mapping[str, AggregatorState],
    replicas: Sequence[ReplicaState] = (),
    *,
    reuse: bool = True,
) -> ReplicaAssignment:
    """Decide which replica runs each unbound aggregator of ``plan``.

    Parameters
    ----------
    plan
        The hierarchy in force, or its aggregators (their ``parent`` links make the tree).
    states
        State per aggregator id (missing: pending and unbound).
    replicas
        Warm replicas; ``idle`` ones not bound to an unfinished aggregator may be reused.
    reuse
        LIFL's reuse policy (True) or the baseline (False).
    """
    specs = plan.aggregators() if isinstance(plan, Plan) else list(plan)
    st = {s.id: states.get(s.id, AggregatorState()) for s in specs}
    busy = {a.replica for a in st.values() if a.replica is not None and a.status != "done"}
    if not reuse:
        return ReplicaAssignment(new={s.id: s.node for s in specs if st[s.id].replica is None})

    # a replica bound to an unfinished aggregator (e.g. a finished leaf promoted to middle)
    # is not free, whatever it reports
    idle = sorted(
        (r for r in replicas if r.idle and r.id not in busy),
        key=lambda r: (r.rank, r.id),
    )
    idle_by_node: dict[str, list[str]] = {}
    for r in idle:
        idle_by_node.setdefault(r.node, []).append(r.id)
    bind: dict[str, str] = {}
    new: dict[str, str] = {}
    deferred: list[str] = []
    taken: set[str] = set()

    def first_done(ids: list[str]) -> str | None:
        done = [i for i in ids if st[i].status == "done" and st[i].replica is not None]
        done = [i for i in done if st[i].replica not in taken and st[i].replica not in busy]
        if not done:
            return None
        best = min(done, key=lambda i: (st[i].done_seq if st[i].done_seq is not None else 0, i))
        return st[best].replica

    for s in specs:
        if st[s.id].replica is not None:
            continue
        if s.role == "leaf":
            pool = idle_by_node.get(s.node, [])
            while pool and pool[0] in taken:
                pool.pop(0)
            if pool:
                rid = pool.pop(0)
                bind[s.id] = rid
                taken.add(rid)
            else:
                new[s.id] = s.node
        else:
            children = [c.id for c in specs if c.parent == s.id]
            promoted = first_done(children)
            if promoted is None:
                deferred.append(s.id)
            else:
                bind[s.id] = promoted
                taken.add(promoted)
    assert TOP_ID not in new  # with reuse the top is always a promoted middle
    return ReplicaAssignment(bind=bind, new=new, deferred=tuple(deferred))
