"""The node gateway's side of the control plane: pushed plans, early closes, load.

``PUT /v1/jobs/{job}/rounds/{r}/plan`` (:func:`push_plan`), ``POST .../close``
(:func:`close_round`) and the queue length reported in ``GET /v1/jobs/{job}`` (:func:`load`).
The checks and plan arithmetic are pure (:mod:`gateway.replan`); this module applies them to
a running node gateway (:class:`~gateway.node.Node`) on its event loop.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from gateway.errors import GatewayError
from gateway.replan import PlanConflict, plan_from_json, shrink_plan

if TYPE_CHECKING:
    from gateway.jobs import Job
    from gateway.node import Node
    from gateway.rounds import RoundEngine

log = logging.getLogger(__name__)


def _admit(job: Job, data: Any) -> None:
    """An enrolled job's clients are those its plans name (the control plane enrolled them)."""
    if job.enrolled and isinstance(data, dict) and isinstance(data.get("client_nodes"), dict):
        job.admit(list(data["client_nodes"]))


def push_plan(gw: Node, job: Job, rnd: int, data: Any) -> dict[str, Any]:
    """Take the control plane's plan for round ``rnd`` (open now, or the next one).

    Raises
    ------
    PlanInvalid
        422: the plan cannot run (unknown node or client, goals, cycle, top not on root).
    PlanConflict
        409: it would lose or move updates the round already holds.
    """
    _admit(job, data)
    plan, version = plan_from_json(data, nodes=job.nodes, root=job.root, clients=job.client_set)
    _check_round_of_plan(job, rnd)
    job.managed = True
    eng = job.engine
    if eng is None or eng.round != rnd:
        job.pending_plans[rnd] = (plan, version)
        return {"job": job.name, "round": rnd, "applied": False, "pending": True}
    if eng.frozen:
        raise PlanConflict(f"round {rnd} was closed here; it aggregates what arrived")
    restarted = eng.apply_plan(plan, version)
    job.plan = plan
    if job.awaiting_plan:
        job.awaiting_plan = False
        log.info("job %s round %d: the control plane's plan v%s arrived", job.name, rnd, version)
    gw.pump(job)
    return {
        "job": job.name,
        "round": rnd,
        "applied": True,
        "pending": False,
        "goal": plan.goal,
        "node_goal": plan.node_goal(gw.settings.node),
        "restarted": restarted,
    }


def _check_round_of_plan(job: Job, rnd: int) -> None:
    open_r = job.open_round
    if open_r is None or rnd < open_r:
        raise GatewayError(
            f"round {rnd} is over here (model version {job.version})",
            status=409,
            code="stale_round",
        )
    if rnd > open_r + 1:
        raise GatewayError(
            f"round {rnd} is too far ahead; the open round is {open_r}",
            status=409,
            code="future_round",
        )


def close_round(gw: Node, job: Job, rnd: int, received: dict[str, int] | None) -> dict[str, Any]:
    """Stop taking updates for ``rnd`` here and, when the counts are known, aggregate them.

    Without ``received`` only this node's intake closes, unless the plan takes updates on
    this node alone (then its goals drop to what arrived at once). With ``received`` (updates
    per node; nodes left out, e.g. dead ones, count 0) the plan shrinks to those counts, so
    the round completes from exactly the updates that reached the listed nodes.
    """
    _check_round_of_plan(job, rnd)
    eng = job.engine
    if eng is None or eng.round != rnd:
        raise GatewayError(
            f"round {rnd} is not open on this node yet", status=409, code="round_not_open"
        )
    me = gw.settings.node
    here = eng.accepted
    answer: dict[str, Any] = {
        "job": job.name,
        "round": rnd,
        "node": me,
        "received": here,
        "frozen": True,
        "applied": False,
        "goal": eng.plan.goal,
    }
    intake_nodes = {s.node for s in eng.plan.slots if not eng.plan.children(s.id)}
    if received is None and intake_nodes - {me}:
        eng.frozen = True
        return answer
    counts = dict(received or {})
    if counts.get(me, here) != here:
        raise PlanConflict(
            f"node {me} holds {here} updates of round {rnd}, not {counts.get(me)}; "
            "close again with its count"
        )
    if eng.result is not None:
        return {**answer, "applied": True}
    plan = shrink_plan(  # raises PlanConflict (nothing left to aggregate): intake stays open
        eng.plan,
        me,
        local_held={st.slot.id: st.assigned for st in eng.intake},
        remote_done={sid for sid, st in eng.slots.items() if not st.local and st.done},
        received={n: c for n, c in counts.items() if n != me},
    )
    eng.frozen = True
    if plan.to_json()["slots"] != eng.plan.to_json()["slots"]:
        eng.apply_plan(plan, eng.plan_version)
        job.plan = plan
        gw.pump(job)
    log.warning(
        "job %s round %d closed on %s: aggregating %d updates (was %d); per node %s",
        job.name,
        rnd,
        me,
        plan.goal,
        answer["goal"],
        counts or {me: here},
    )
    return {**answer, "applied": True, "goal": plan.goal}


def load(gw: Node, job: Job) -> dict[str, Any]:
    """Queue length ``Q = k * E`` from the arrival rate and the router's exec times."""
    eng = job.engine
    k = job.arrival_rate()
    execs: list[float] = []
    try:
        mine = {e for e, info in gw.router.endpoints().items() if info.job == job.id}
        for eid, m in gw.router.metrics().items():
            if eid in mine and m.mean_exec_ns is not None:
                execs.append(m.mean_exec_ns / 1e9)
    except Exception:  # router stopping: report what we have
        log.debug("router metrics unavailable", exc_info=True)
    e = sum(execs) / len(execs) if execs else None
    pending = eng.pending() + len(job.inflight) if eng is not None else 0
    return {
        "queue": k * e if e is not None else float(pending),
        "pending": pending,
        "k": k,
        "E_s": e,
        **endpoint_load(gw),
        "waiting_slots": gw.shortage.get(job.name, 0),
    }


def endpoint_load(gw: Node) -> dict[str, int]:
    """This node's ``aggregator`` endpoints: registered, free (no open slot) and busy."""
    from gateway.endpoints import free_endpoints

    try:
        total = sum(1 for i in gw.router.endpoints().values() if not i.local)
        free = len(free_endpoints(gw))
    except Exception:  # router stopping
        return {"endpoints": 0, "free_endpoints": 0}
    return {"endpoints": total, "free_endpoints": free}


async def persist_plan(gw: Node, job: Job, rnd: int) -> None:
    """Journal the plan this node runs (or will run) for ``rnd``, and whether it is closed."""
    eng = job.engine
    if eng is not None and eng.round == rnd and (job.plan is not job.base_plan or eng.frozen):
        rec = {**job.plan.to_json(), "version": eng.plan_version, "frozen": eng.frozen}
    elif rnd in job.pending_plans:
        plan, version = job.pending_plans[rnd]
        rec = {**plan.to_json(), "version": version, "frozen": False}
    else:
        return
    await gw.journal.save_plan(job.name, rnd, gw.settings.node, rec)


async def resume_plan(gw: Node, job: Job) -> None:
    """After a restart: run the open round's journaled plan again (before its updates return)."""
    eng = job.engine
    if eng is None:
        return
    rec = await gw.journal.plan(job.name, eng.round, gw.settings.node)
    if rec is None:
        # the round's plan was pushed while this gateway was down, or not yet: if the control
        # plane planned the round before, wait for its plan (it sends it again when it sees
        # this node run another); uploads meanwhile would land in slots it moves
        if await gw.journal.plan(job.name, eng.round - 1, gw.settings.node) is not None:
            job.managed = job.awaiting_plan = True
            log.warning(
                "job %s: round %d resumes awaiting the control plane's plan", job.name, eng.round
            )
        return
    job.managed = True
    try:
        _admit(job, rec)
        plan, version = plan_from_json(rec, nodes=job.nodes, root=job.root, clients=job.client_set)
        eng.apply_plan(plan, version)
        # the round runs the control plane's plan again (an enrolled job opened awaiting it)
        job.awaiting_plan = False
    except GatewayError as exc:
        # e.g. its top was here and another node took the job over meanwhile: the control
        # plane has moved this node's clients, and uploads under a plan of our own would
        # land in slots no plan of its aggregates. Wait for its plan, as at a round's opening.
        job.awaiting_plan = True
        log.error(
            "job %s: journaled plan of round %d not resumed (%s); the round awaits the "
            "control plane's plan",
            job.name,
            eng.round,
            exc,
        )
        return
    job.plan = plan
    eng.frozen = bool(rec.get("frozen"))
    log.info("job %s: round %d resumes with plan v%s", job.name, eng.round, version)


def open_tasks(eng: RoundEngine) -> int:
    """Tasks of the round left on this node that need an endpoint of their own.

    An unfinished local slot that takes updates counts one; an unfinished local middle or
    top counts one once its children are all done (before that it waits for them, and is
    no shortage: see :mod:`gateway.endpoints`). Once this node's part of the round is done
    (its partial sent to the root, which has not published yet) the count is 0.
    """
    n = 0
    for sid, st in eng.slots.items():
        if not st.local or st.done is not None:
            continue
        kids = eng.plan.children(sid)
        if not kids or all(eng.slots[c].done is not None for c in kids):
            n += 1
    return n


def node_load(gw: Node) -> dict[str, Any]:
    """This node's aggregator load for the control plane's autoscaler (``/healthz``).

    ``queue`` sums each open round's ``k * E``, at most its :func:`open_tasks` (the tasks
    left here that need an endpoint of their own): a round whose part on this node is done
    asks for none, however recent its arrivals (``k`` counts those of the last seconds).
    """
    queue = 0.0
    for job in gw.jobs.values():
        if job.engine is not None:
            ld = load(gw, job)
            if ld["E_s"] is not None:  # before any task finished there is no k * E yet
                queue += min(ld["k"] * ld["E_s"], open_tasks(job.engine))
    return {
        **endpoint_load(gw),
        "waiting_slots": sum(gw.shortage.values()),
        "queue": queue,
    }
