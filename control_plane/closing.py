"""Ending a job's rounds: the progress polls, closing at goal or at the deadline, failing.

Each control period :meth:`RoundClosing.poll` reads every healthy gateway's status of each
job (at once, without the job's lock), then, holding the job's lock and only if the round is
still the one it read, applies it: the round is ``closed`` once a gateway published its model
(``expired`` when it was closed at the deadline), moves to ``aggregating`` at its goal, and
at its deadline closes with what arrived (:meth:`RoundClosing._at_deadline`).

Closing a round early on the gateways is two steps (:meth:`RoundClosing._shrink_round`):
every gateway stops its intake and says how many updates it holds ("frozen"), then every
gateway gets those counts and lowers its plan's goals to them. A gateway that fails either
step (down for a moment, answering 503, timing out) leaves the close *pending*: what the
others answered is kept in the round (``close_counts``, ``close_applied``) and the step is
tried again on the gateways still owed it, with a growing pause (:data:`RETRY_PAUSE_S`), so
no node stays frozen waiting for a round that never closes. After the deadline a close that
failed ``close_retries`` times fails the job (which drops its live state on the gateways);
before it, at the goal, the close is retried until the deadline takes over.

Every status read also carries the acknowledged updates a gateway reports in no published
model (its ``dropped``: a partial its root published without, a slot unfinished when the
round ended there): each slot's are counted once in its round's ``lost``
(:meth:`~control_plane.jobs.JobState.count_dropped`). A node learns that only once the round's
model is out, so a job's gateways are still read for it for :data:`DROP_WATCH_S` after its
round ended while no other round of it is open.
"""

from __future__ import annotations

import logging
from typing import Any

from control_plane.errors import ControlPlaneError, GatewayError, RoundStateError
from control_plane.gateways import GatewayJobStatus
from control_plane.jobs import JobState, RoundInfo, delivered_per_leaf
from control_plane.opening import RoundOpening
from control_plane.planning import replan

log = logging.getLogger(__name__)

#: pause before the n-th retry of a pending close: ``min(RETRY_PAUSE_S * 2**(n-1), MAX)``
RETRY_PAUSE_S = 0.5
MAX_RETRY_PAUSE_S = 10.0

#: what :meth:`RoundClosing._shrink_round` returns: the round closed on every gateway; a
#: gateway still owes a step (tried again later); the round cannot be closed this way
DONE, PENDING, CANNOT = "done", "pending", "cannot"

#: seconds after a job's round ended that its gateways are still read for the updates they
#: report dropped, while no other round of the job is open (whose polls read them)
DROP_WATCH_S = 60.0


class RoundClosing(RoundOpening):
    """Polls the gateways and ends rounds (see the module)."""

    async def close_round(self, name: str, state: str = "closed") -> RoundInfo:
        """Close the open round (``closed`` at goal, ``expired`` at the deadline)."""
        async with self.job_lock(name):
            job = self.job(name)
            rnd = await self._close(job, state)
            await self._save(job)
            return rnd

    async def _close(self, job: JobState, state: str) -> RoundInfo:
        rnd = job.current
        if rnd is None or rnd.state not in ("open", "aggregating"):
            raise RoundStateError(f"job {job.spec.name!r} has no open round to close")
        rnd.state, rnd.closed_at = state, self.clock()
        if rnd.closing is None and rnd.close_pending is not None and rnd.close_final:
            # published while a node still owed the close's second step: the round was
            # closed early all the same, on the counts the other nodes took
            rnd.closing, rnd.closed_with = rnd.close_pending, dict(rnd.close_final)
        job.completed += 1
        job.record(
            {
                "round": rnd.number,
                "state": state,
                "received": sum(rnd.received.values()),
                # the updates in the published model (the root's count): "received" is what
                # the polls saw arrive, which misses a round published between two polls
                "aggregated": rnd.aggregated,
                "lost": rnd.lost,
                "seconds": rnd.closed_at - rnd.opened_at,
                "published": rnd.published,
                "closing": rnd.closing,
                "selected_by": rnd.selected_by,
                "failures": dict(rnd.failures),
                "close_attempts": rnd.close_attempts,
            }
        )
        self.plans.pop(job.spec.name, None)
        log.info(
            "job %s round %d %s: %s update(s) aggregated, %d seen arriving by the polls",
            job.spec.name,
            rnd.number,
            state,
            "?" if rnd.aggregated is None else rnd.aggregated,
            sum(rnd.received.values()),
        )
        if self.auto_rounds and not job.done and self.healthy_nodes():
            await self._open_next(job)
        return rnd

    # ------------------------------------------------------------------ polls
    async def poll(self) -> None:
        """Read each healthy gateway's job status; close rounds at goal or deadline. A job
        busy with another step (its lock held) is polled at the next period."""
        for job in list(self.jobs.values()):
            await self._poll_job(job)

    async def _poll_job(self, job: JobState) -> None:
        name = job.spec.name
        lock = self.job_lock(name)
        if lock.locked():
            return
        rnd = job.current
        if rnd is None:
            async with lock:
                if self.still_current(job):
                    await self._open_first_round(job)
            return
        if rnd.state not in ("open", "aggregating"):
            if rnd.closed_at is not None and self.clock() - rnd.closed_at < DROP_WATCH_S:
                statuses = await self._read_statuses(name)
                async with lock:
                    if any([self._count_dropped(job, n, st) for n, st in statuses.items()]):
                        await self._save(job)
            return
        statuses = await self._read_statuses(name)
        async with lock:
            if not self.still_current(job, rnd):  # another step ended the round meanwhile
                return
            for n, st in statuses.items():
                self._count_dropped(job, n, st)
            await self._apply_statuses(job, rnd, statuses)
            await self._save(job)

    async def _read_statuses(self, name: str) -> dict[str, GatewayJobStatus]:
        """Job ``name``'s status on each healthy gateway that answered."""
        read = await self.on_nodes(self.healthy_nodes(), lambda c: c.job_status(name))
        statuses: dict[str, GatewayJobStatus] = {}
        for n, st in read.items():
            if isinstance(st, ControlPlaneError):
                log.debug("poll %s: %s", n, st.detail)
            else:
                statuses[n] = st
        return statuses

    @staticmethod
    def _count_dropped(job: JobState, node: str, st: GatewayJobStatus) -> int:
        """Count, once per slot, the updates ``node`` reports dropped (in the rounds' ``lost``)."""
        got = 0
        for rnd, slot, updates in st.dropped:
            n = job.count_dropped(node, rnd, slot, updates)
            if n:
                log.error(
                    "job %s round %d: node %s reports %d acknowledged update(s) of slot %d in "
                    "no published model; counted lost",
                    job.spec.name,
                    rnd,
                    node,
                    n,
                    slot,
                )
            got += n
        return got

    async def _apply_statuses(
        self, job: JobState, rnd: RoundInfo, statuses: dict[str, GatewayJobStatus]
    ) -> None:
        published = versioned = False
        for n, st in statuses.items():
            versioned = versioned or st.reports_version
            if st.round == rnd.number and st.version < rnd.number and rnd.closing is None:
                rnd.received[n] = st.received  # after closing, the counts are fixed
                await self._repush(job, rnd, n, st)
            # a gateway past this round (or holding its model) published it: goal met
            published = published or st.round > rnd.number or st.version >= rnd.number
            if st.last_published is not None and st.last_published[0] == rnd.number:
                rnd.aggregated = st.last_published[1]
        self.queues.observe({n: st.queue for n, st in statuses.items()})
        at_goal = sum(rnd.received.values()) >= rnd.goal
        now = self.clock()
        if published or (at_goal and not versioned):
            rnd.published = published
            await self._close(job, "expired" if rnd.closing == "deadline" else "closed")
        elif rnd.close_pending is not None and rnd.closing is None:
            if now >= rnd.close_retry_at:  # a close under way: the gateways still owed a step
                if now >= rnd.deadline_at:
                    await self._at_deadline(job, rnd, now, versioned)
                else:
                    await self._shrink_round(job, rnd, rnd.close_pending)
        elif at_goal and rnd.state == "open":
            rnd.state = "aggregating"
            log.info("job %s round %d at goal: aggregating", job.spec.name, rnd.number)
            if rnd.placement == "coordinator" and versioned:
                # the plan covers every selected client: aggregate the first `goal`
                await self._shrink_round(job, rnd, "goal")
        elif now >= rnd.deadline_at and rnd.closing is None and statuses:
            # (decided only on what gateways said in this poll: none answered, none
            # counted; a restarting gateway is asked again next tick)
            await self._at_deadline(job, rnd, now, versioned)
        elif now >= max(rnd.deadline_at, rnd.closing_at) + job.spec.deadline_s:
            await self._fail(
                job,
                f"round {rnd.number}: no global model published a deadline "
                f"({job.spec.deadline_s:g} s) after it was closed ({rnd.closing})",
            )

    # ------------------------------------------------------------------ deadlines
    async def _at_deadline(
        self, job: JobState, rnd: RoundInfo, now: float, versioned: bool
    ) -> None:
        """The round's deadline passed before its goal: close it with what arrived if its
        minimum came; else give it another deadline (``on_shortfall="reopen"``, at most
        ``max_reopens`` times) or fail the job. Never a gateway left waiting on the round.
        A close a gateway could not take part in is tried again, ``close_retries`` times,
        before the job fails.

        Gateways that keep their own plan or report no model version (they cannot close a
        round or say it published) only get the round ended here, ``expired``, as before."""
        spec = job.spec
        if rnd.placement != "coordinator" or not versioned:
            await self._close(job, "expired")
            return
        got, least = sum(rnd.received.values()), min(spec.min_updates, rnd.goal)
        if got >= least:
            if rnd.close_pending != "deadline":  # the retries count from the deadline on
                rnd.close_attempts = 0
            outcome = await self._shrink_round(job, rnd, "deadline")
            if outcome == CANNOT:
                await self._fail(
                    job,
                    f"round {rnd.number}: {got} update(s) arrived by the deadline, but the "
                    "gateways could not close the round on them",
                )
            elif outcome == PENDING and rnd.close_attempts >= self.close_retries:
                await self._fail(
                    job,
                    f"round {rnd.number}: {got} update(s) arrived by the deadline, but the "
                    f"gateways could not close the round on them in {rnd.close_attempts} "
                    f"attempts: {rnd.close_error}",
                )
            return
        if spec.on_shortfall == "reopen" and rnd.reopened < spec.max_reopens:
            rnd.reopened += 1
            rnd.deadline_at = now + spec.deadline_s
            log.warning(
                "job %s round %d: %d of its minimum %d update(s) by the deadline; re-opened "
                "for another %g s (%d of %d)",
                spec.name,
                rnd.number,
                got,
                least,
                spec.deadline_s,
                rnd.reopened,
                spec.max_reopens,
            )
            return
        again = f", after {rnd.reopened} re-opening(s)" if rnd.reopened else ""
        await self._fail(
            job,
            f"round {rnd.number}: {got} of its minimum {least} update(s) arrived by the "
            f"deadline{again}",
        )

    # ------------------------------------------------------------------ early closes
    async def _shrink_round(
        self, job: JobState, rnd: RoundInfo, why: str, nodes: list[str] | None = None
    ) -> str:
        """Close the round's intake on ``nodes`` (default: the job's healthy nodes) and have
        them aggregate what reached them; resumes a close left pending (see the module).

        Returns :data:`DONE` (every gateway closed it: the round is ``aggregating`` with
        ``closed_with``), :data:`PENDING` (a gateway failed a step: tried again later) or
        :data:`CANNOT` (a gateway has no close route, or nothing arrived anywhere).
        Call it holding the job's lock.
        """
        nodes = nodes or self._job_nodes(job)
        name = job.spec.name
        rnd.close_pending = why
        errors: dict[str, str] = {}
        if not rnd.close_final:  # step 1: every node stops its intake and counts
            todo = [n for n in nodes if n not in rnd.close_counts]
            closes = await self.on_nodes(todo, lambda c: c.close_round(name, rnd.number, None))
            for n, ans in closes.items():
                if isinstance(ans, ControlPlaneError):
                    errors[n] = ans.detail
                elif ans is None:
                    log.warning("job %s round %d: %s cannot close rounds", name, rnd.number, n)
                    self._end_close(rnd)
                    return CANNOT
                else:
                    rnd.close_counts[n] = int(ans.get("received", 0))
            if errors:
                return self._close_failed(job, rnd, "stop its intake", errors)
            final = {n: rnd.close_counts[n] for n in nodes}  # a node left out counts 0
            if sum(final.values()) == 0:
                log.warning(
                    "job %s round %d: nothing arrived; cannot close it (%s)", name, rnd.number, why
                )
                self._end_close(rnd)
                return CANNOT
            rnd.close_final = final
        # step 2: every node lowers its goals to the counts (the same counts on every node),
        # the root first: a partial of a node that shrank its plan must not reach the root
        # before the root shrank its own (it would count that node's subtree at its old goal)
        final = dict(rnd.close_final)
        live = set(self.healthy_nodes())
        todo = [n for n in final if n not in rnd.close_applied and n in live]
        for step in ([n for n in todo if n == job.root], [n for n in todo if n != job.root]):
            applies = await self.on_nodes(step, lambda c: c.close_round(name, rnd.number, final))
            for n, ans in applies.items():
                # a node that already saw the round published (its partial went in with the
                # root's new goals) answers stale_round: it took part
                if isinstance(ans, GatewayError) and ans.error == "stale_round":
                    rnd.close_applied.append(n)
                elif isinstance(ans, ControlPlaneError):
                    errors[n] = ans.detail
                else:
                    rnd.close_applied.append(n)
            if errors:
                return self._close_failed(job, rnd, "aggregate the counts", errors)
        old = self.plans.get(name) or self._plan_for(job, rnd)
        plan = self._top_on_root(job, replan(old, final, delivered_per_leaf(old, final)))
        self.plans[name] = plan
        rnd.plan_version = plan.version
        rnd.received, rnd.closed_with, rnd.closing = dict(final), dict(final), why
        rnd.state, rnd.closing_at = "aggregating", self.clock()
        attempts = rnd.close_attempts
        self._end_close(rnd)
        rnd.close_attempts = attempts  # kept: how many tries the close took
        log.info(
            "job %s round %d closed early (%s): aggregating %d updates %s%s",
            name,
            rnd.number,
            why,
            sum(final.values()),
            final,
            f" after {attempts} failed attempt(s)" if attempts else "",
        )
        return DONE

    def _close_failed(
        self, job: JobState, rnd: RoundInfo, step: str, errors: dict[str, str]
    ) -> str:
        """A step of a close failed on ``errors``' nodes: count it, pause, keep it pending."""
        rnd.close_attempts += 1
        pause = min(RETRY_PAUSE_S * 2 ** (rnd.close_attempts - 1), MAX_RETRY_PAUSE_S)
        rnd.close_retry_at = self.clock() + pause
        rnd.close_error = "; ".join(f"{n}: {why}" for n, why in sorted(errors.items()))[:500]
        log.warning(
            "job %s round %d: closing (%s) is pending: %s could not %s (attempt %d; again in "
            "%.1f s): %s; frozen so far: %s",
            job.spec.name,
            rnd.number,
            rnd.close_pending,
            ", ".join(sorted(errors)),
            step,
            rnd.close_attempts,
            pause,
            rnd.close_error,
            sorted(rnd.close_counts),
        )
        return PENDING

    @staticmethod
    def _end_close(rnd: RoundInfo) -> None:
        rnd.close_pending, rnd.close_error, rnd.close_retry_at = None, "", 0.0
        rnd.close_counts, rnd.close_final, rnd.close_applied = {}, {}, []
        rnd.close_attempts = 0

    # ------------------------------------------------------------------ failing
    async def _fail(self, job: JobState, reason: str) -> None:
        """Fail the job: its open round ends ``failed`` and the gateways forget the job's live
        state (its round, objects, journal), so none waits on it; the rounds it finished stay
        checkpointed in MinIO. Clients asking for an assignment get 409 ``job_failed``. The
        gateways are told first, so a view that says the job failed finds it gone from every
        gateway that answers; one that cannot be reached now is told once it answers again
        (:mod:`control_plane.deletions`, the view's ``deleting_on``). Call it holding the
        job's lock."""
        log.error("job %s failed: %s", job.spec.name, reason)
        await self.delete_on_gateways(job.spec.name, job.root)
        rnd = job.current
        if rnd is not None and rnd.state in ("open", "aggregating"):
            rnd.state, rnd.closed_at = "failed", self.clock()
            entry: dict[str, Any] = {
                "round": rnd.number,
                "state": "failed",
                "received": sum(rnd.received.values()),
                "lost": rnd.lost,
                "seconds": rnd.closed_at - rnd.opened_at,
                "published": rnd.published,
                "closing": rnd.closing,
                "reason": reason,
                "failures": dict(rnd.failures),
                "close_attempts": rnd.close_attempts,
            }
            job.record(entry)
        job.failed = reason
        self.plans.pop(job.spec.name, None)
