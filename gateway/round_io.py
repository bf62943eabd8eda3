"""A job's rounds on this node, wired to their I/O: a round opened with its callbacks, slots given
endpoints, frames received, results published, partials forwarded and journaled.

The round's logic is :class:`~gateway.rounds.RoundEngine` (or
:class:`~gateway.sharded.ShardedRound` for a robust rule); it does its I/O through the callables
:func:`open_round` gives it, which this module binds to the node.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import bpf
from gateway import forward
from gateway.endpoints import assign
from gateway.jobs import Job, RoundTimes
from gateway.plan import Slot
from gateway.publish import publish_round
from gateway.rounds import RoundEngine
from gateway.sharded import ShardedRound
from gateway.slots import Input

if TYPE_CHECKING:
    from gateway.node import Node

log = logging.getLogger(__name__)


def open_round(gw: Node, job: Job) -> None:
    """Open ``job``'s next round here (or, when it has run them all, keep only its model)."""
    r = job.open_round
    if r is None:
        job.engine = None
        for k in job.history.values():  # no update will train on these now
            if job.ns.leases(k):
                job.ns.free(k)
        job.history.clear()
        job.ns.trim_pool(0)  # finished: keep only the global model
        return
    assert job.endpoint is not None

    def publish(res: Input) -> None:
        _on_result(gw, job, res)

    def forward(slot: Slot, inp: Input) -> None:
        _forward(gw, job, slot, inp)

    def persist(sid: int, inp: Input, release: Callable[[], None]) -> None:
        journal_slot(gw, job, r, sid, inp, release)

    def checkpoint(sid: int, inp: Input, children: list[int], release: Callable[[], None]) -> None:
        journal_slot(gw, job, r, sid, inp, release, children=children)

    pushed = job.pending_plans.pop(r, None)
    for old in [k for k in job.pending_plans if k < r]:
        del job.pending_plans[old]
    job.plan = pushed[0] if pushed is not None else job.base_plan
    job.awaiting_plan = pushed is None and job.managed
    common: dict[str, Any] = dict(
        job_id=job.id,
        node=gw.settings.node,
        round=r,
        plan=job.plan,
        store=job.ns,
        gateway_ep=job.endpoint.id,
        send=job.endpoint.send,
        publish=publish,
        forward=forward,
        persist=persist,
        checkpoint=checkpoint,
        refused=lambda _exc: gw.metrics.store_refusals.inc(),
        failed=gw.metrics.aggregator_failures.inc,
    )
    if job.rule is not None:

        def base() -> bytes:
            assert job.global_key is not None
            return job.global_key

        job.engine = ShardedRound(
            rule=job.rule,
            spec=job.spec,
            expected=job.goal,
            base=base,
            width=lambda: sum(1 for i in gw.router.endpoints().values() if not i.local),
            **common,
        )
    else:
        job.engine = RoundEngine(**common, lazy=gw.settings.lazy, masked=job.spec.masked)
    if pushed is not None:
        job.engine.plan_version = pushed[1]
        log.info("job %s round %d opens with the pushed plan v%s", job.name, r, pushed[1])
    elif job.awaiting_plan:
        log.info("job %s round %d opens awaiting the control plane's plan", job.name, r)
    job.times.append(RoundTimes(r))


def journal_slot(
    gw: Node,
    job: Job,
    rnd: int,
    slot: int,
    inp: Input,
    release: Callable[[], None],
    *,
    children: list[int] | None = None,
) -> None:
    """Journal a slot's sealed partial (or, with ``children``, its checkpoint covering
    them), then ``release`` what it supersedes. One job's records are written in order,
    so a later checkpoint never lands before an earlier one. A write Redis refuses is
    tried again until it lands (:class:`~gateway.background.JournalRetry`); the inputs
    stay held meanwhile. Given up only when the round is over here (nothing reads it)."""
    me = gw.settings.node
    rec: dict[str, Any] = {
        "key": inp.key.hex(),
        "weight": inp.weight,
        "count": inp.count,
        "clients": list(inp.clients),
    }

    def still() -> bool:
        eng = job.engine
        return (
            gw.jobs.get(job.name) is job and eng is not None and eng.round == rnd and not eng.closed
        )

    async def run() -> None:
        async with job.journal_lock:
            if children is None:
                await gw.retry(
                    "slot_done",
                    lambda: gw.journal.slot_done(job.name, rnd, slot, rec, node=me),
                    still,
                )
            else:
                rec["children"] = children
                await gw.retry(
                    "slot_checkpoint",
                    lambda: gw.journal.slot_checkpoint(job.name, rnd, slot, rec, node=me),
                    still,
                )
        release()

    gw.background.spawn(run(), f"journal:{job.name}/{rnd}/{slot}")


def pump(gw: Node, job: Job) -> None:
    """Give the job's waiting slots endpoints (granting them the job); see gateway.endpoints.

    Never raises: its callers have already acknowledged what they hand the round (an
    upload journaled, a frame taken), and the housekeeping loop, which pumps every job
    every few milliseconds, must go on. A failure leaves the slots waiting for the next
    pump; it is logged (once in a row per job) and counted as a ``pump`` task failure."""
    try:
        short = assign(gw, job)
    except Exception:
        gw.metrics.task_failures.labels(task="pump").inc()
        if job.name not in gw.pump_failing:
            gw.pump_failing.add(job.name)
            log.exception("job %s: giving its slots endpoints failed; tried again", job.name)
        return
    gw.pump_failing.discard(job.name)
    if short:
        gw.shortage[job.name] = short
    else:
        gw.shortage.pop(job.name, None)


def receive(gw: Node, job: Job) -> None:
    """The job's receive thread: hands each frame its endpoint gets to the event loop."""
    ep = job.endpoint
    assert ep is not None and gw.loop is not None
    while not gw.stopping:
        try:
            f = ep.recv(timeout=0.5)
        except bpf.EndpointClosed:
            return
        if f is not None:
            gw.loop.call_soon_threadsafe(_on_frame, gw, job, f)


def _on_frame(gw: Node, job: Job, f: bpf.Frame) -> None:
    eng = job.engine
    if eng is not None:
        eng.on_frame(f)
        pump(gw, job)


def on_disconnect(gw: Node, endpoint_id: int) -> None:
    """An endpoint went: the rounds it served deliver its work again elsewhere."""
    for job in gw.jobs.values():
        if job.engine is not None and job.engine.on_disconnect(endpoint_id):
            gw.metrics.redeliveries.inc()
            pump(gw, job)


def _on_result(gw: Node, job: Job, res: Input) -> None:
    eng = job.engine
    assert eng is not None
    if job.times:
        job.times[-1].result_ns = time.monotonic_ns()
    gw.background.spawn(publish_round(gw, job, eng, res), f"publish:{job.name}/{eng.round}")


def _forward(gw: Node, job: Job, slot: Slot, inp: Input) -> None:
    eng = job.engine  # the round whose slot finished: the task may start in a later one
    assert eng is not None
    gw.background.spawn(
        forward.send_partial(gw, job, eng, slot, inp),
        f"forward:{job.name}/{eng.round}/{slot.id}",
    )
