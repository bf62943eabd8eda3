"""Which warm ``aggregator`` endpoint runs which slot: grants and LIFL's reuse on one node.

Replicas of the ``aggregator`` function register their endpoints with this node's router in
no job. When a slot of an open round has work and no endpoint, :func:`assign` picks one with
:func:`control_plane.reuse.assign_replicas` (a middle or top takes the endpoint of its first
finished child; a leaf takes an idle endpoint, warmest first: one already granted this job,
then one in no job, then one idle in another job) and grants it the job through the router
(:meth:`bpf.RouterServer.grant`) before the TASK frame. An eager middle or top parks between
its children's partials (``gateway/rounds.py``), so it takes any free endpoint; a lazy one,
which would wait for its children holding its endpoint, never takes the node's last free
one. Either way rounds progress with a single endpoint.
Slots still without an endpoint are the node's shortage, which the control plane answers by
scaling the function. A round of a robust rule (``gateway/sharded.py``) has no slots to run:
its coordinate shards take free endpoints, warmest first, one shard each.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Literal

import bpf
from control_plane.planning import AggregatorSpec
from control_plane.reuse import AggregatorState, ReplicaState, assign_replicas
from gateway.plan import TOP
from gateway.rounds import RoundEngine
from gateway.sharded import ShardedRound
from gateway.slots import SlotState

if TYPE_CHECKING:
    from gateway.jobs import Job
    from gateway.node import Node

log = logging.getLogger(__name__)


def _rid(endpoint: int) -> str:
    return f"{endpoint:010d}"  # ids sort as numbers


def _reuse_view(eng: RoundEngine) -> tuple[list[AggregatorSpec], dict[str, AggregatorState]]:
    """The engine's local slots as the reuse rules see them (slots without children take
    updates: leaves, whatever their place in the tree)."""
    specs: list[AggregatorSpec] = []
    states: dict[str, AggregatorState] = {}
    for sid, st in eng.slots.items():
        if not st.local:
            continue
        kids = eng.plan.children(sid)
        role: Literal["leaf", "middle", "top"] = (
            "leaf" if not kids else ("top" if st.slot.role == TOP else "middle")
        )
        parent = None if st.slot.parent is None else str(st.slot.parent)
        specs.append(AggregatorSpec(str(sid), role, st.slot.node, st.slot.goal, parent))
        if st.done is not None and st.endpoint is not None:
            states[str(sid)] = AggregatorState("done", _rid(st.endpoint), done_seq=st.done_seq)
        elif st.endpoint is not None:
            states[str(sid)] = AggregatorState("running", _rid(st.endpoint))
    return specs, states


def free_endpoints(gw: Node) -> dict[int, bpf.EndpointInfo]:
    """Function endpoints registered here that no open round of any job is using."""
    busy: set[int] = set()
    for job in gw.jobs.values():
        if job.engine is not None:
            busy |= job.engine.busy_endpoints()
    return {
        eid: info
        for eid, info in gw.router.endpoints().items()
        if not info.local and eid not in busy
    }


def assign(gw: Node, job: Job) -> int:
    """Give endpoints to the job's waiting slots; returns how many still wait for want of one
    (the node's shortage). A middle or top left to wait for its children is not short: it runs
    once they are done, on whatever endpoint is free then."""
    eng = job.engine
    if eng is None:
        return 0
    if isinstance(eng, ShardedRound):
        return _assign_shards(gw, job, eng)
    waiting = eng.needs_endpoint()
    if not waiting:
        return 0
    free = free_endpoints(gw)
    node = gw.settings.node

    def rank(info: bpf.EndpointInfo) -> int:
        return _warmth(job, info)

    replicas = [ReplicaState(_rid(e), node, True, rank(i)) for e, i in free.items()]
    specs, states = _reuse_view(eng)
    wanted = {str(st.slot.id) for st in waiting}
    # slots without work yet must not take endpoints: leave them out of the view
    specs = [s for s in specs if s.id in wanted or s.id in states]
    plan = assign_replicas(specs, states, replicas)
    order = sorted(free, key=lambda e: (rank(free[e]), e))

    def may_take(st: SlotState) -> bool:
        # A lazy middle or top waits for its other children holding its endpoint: it never
        # takes the node's last free endpoint, so a leaf can always run and the round always
        # progresses, however few endpoints there are. Deferred, it is no shortage: it runs
        # once its children are done.
        return len(free) > 1 or eng.parks(st) or not _waits_for_children(eng, st)

    left = list(waiting)
    for st in waiting:
        rid = plan.bind.get(str(st.slot.id))
        if rid is None or int(rid) not in free or not may_take(st):
            continue
        if _start(gw, job, eng, st, int(rid), free):
            left.remove(st)
    deferred = 0
    for st in list(left):  # leaves without a bind, and middles/tops whose child's endpoint
        if not may_take(st):  # is gone or busy: any free endpoint beats waiting
            deferred += 1
            continue
        while order:
            ep = order.pop(0)
            if ep in free and _start(gw, job, eng, st, ep, free):
                left.remove(st)
                break
    return len(left) - deferred


def _assign_shards(gw: Node, job: Job, eng: ShardedRound) -> int:
    """Waiting shards of a sharded round take free endpoints, warmest first, one each;
    returns how many still wait. A start the store refused is asked again first."""
    eng.start_if_ready()
    if not eng.wanted():
        return 0
    free = free_endpoints(gw)
    order = sorted(free, key=lambda e: (_warmth(job, free[e]), e))
    granted = [ep for ep in order[: eng.wanted()] if _grant(gw, job, ep, free[ep])]
    eng.run_shards(granted)
    return eng.wanted()


def _warmth(job: Job, info: bpf.EndpointInfo) -> int:
    """0: already granted ``job``; 1: in no job; 2: idle in another job (LIFL's reuse order)."""
    return 0 if info.job == job.id else 1 if info.job == 0 else 2


def _grant(gw: Node, job: Job, endpoint: int, info: bpf.EndpointInfo) -> bool:
    """Grant ``job`` to a free endpoint through the router (nothing to do if it has it)."""
    if info.job == job.id:
        return True
    try:
        gw.router.grant(endpoint, job.id, str(job.ns.path), role="aggregator")
    except (bpf.RouterError, OSError) as exc:
        log.warning("job %s: endpoint %d not granted: %s", job.name, endpoint, exc)
        return False
    gw.metrics.grants.inc()
    if info.job:
        gw.metrics.reuses.inc()
    return True


def _waits_for_children(eng: RoundEngine, st: SlotState) -> bool:
    """A middle or top some of whose children have not finished."""
    return any(eng.slots[c].done is None for c in eng.plan.children(st.slot.id))


def _start(
    gw: Node,
    job: Job,
    eng: RoundEngine,
    st: SlotState,
    endpoint: int,
    free: dict[int, bpf.EndpointInfo],
) -> bool:
    if not _grant(gw, job, endpoint, free.pop(endpoint)):
        return False
    # False: the store refused the slot's accumulator (it is full); the slot waits, and the
    # endpoint, granted this job but running nothing, stays free for the next pump
    return eng.assign(st.slot.id, endpoint)
