"""Opening a job's rounds: selecting clients, placing them, planning the hierarchy, and
sending the plan to the gateways.

A round opens (:meth:`RoundOpening._open_round`) with ``ceil(goal * overprovision)`` of the
job's selectable clients (at random seeded by job and round, or by Oort's utility,
:mod:`control_plane.selection`), after FLStore's flags of the round before are applied
(``drop_flagged``) and a DP job's privacy is accounted. The plan goes to the job's gateways
as a slot table, all at once; gateways that answer 404/405 keep their static plan and the
assignment follows theirs.
"""

from __future__ import annotations

import logging
import math

from control_plane.deletions import GatewayCleanup
from control_plane.errors import (
    ControlPlaneError,
    JobFailed,
    NoHealthyNodes,
    PrivacyBudgetSpent,
    RoundStateError,
)
from control_plane.gateways import GatewayJobStatus, plan_to_slots
from control_plane.jobs import JobState, RoundInfo, seed_of
from control_plane.planning import Plan
from control_plane.selection import SchedulerUnavailable, Selection, random_selection
from core import privacy

log = logging.getLogger(__name__)


class RoundOpening(GatewayCleanup):
    """Opens rounds and sends their plans (see the module)."""

    async def open_round(self, name: str) -> RoundInfo:
        """Open the job's next round; 409 while one is open or when all rounds are done."""
        async with self.job_lock(name):
            job = self.job(name)
            try:
                return await self._open_round(job)
            finally:  # a refusal may have stopped the job or recorded flags
                await self._save(job)

    async def _open_first_round(self, job: JobState) -> None:
        """Open round 1 of a job waiting for its clients once ``goal`` of them enrolled (a
        failure is logged: the control loop tries again). Call it holding the job's lock."""
        if job.current is not None or job.done or job.failed or not self.auto_rounds:
            return
        if len(job.eligible()) < job.spec.goal:
            return
        try:
            await self._open_round(job)
        except ControlPlaneError as exc:
            log.warning("job %s: round 1 not opened yet: %s", job.spec.name, exc.detail)
        await self._save(job)

    async def _open_round(self, job: JobState) -> RoundInfo:
        if job.current is not None and job.current.state in ("open", "aggregating"):
            raise RoundStateError(f"round {job.current.number} of {job.spec.name!r} is still open")
        if job.stopped:
            raise PrivacyBudgetSpent(f"job {job.spec.name!r} was stopped: {job.stopped}")
        if job.done:
            raise RoundStateError(f"job {job.spec.name!r} finished all {job.spec.rounds} rounds")
        if job.failed:
            raise JobFailed(job.spec.name, job.failed)
        nodes = self._job_nodes(job)
        if not nodes:
            raise NoHealthyNodes()
        spec = job.spec
        drop_note = await self._drop_flagged(job)
        rnd, plan = self.plan_round(job, nodes, await self._select(job))
        rnd.drop_note = drop_note
        spend = self._privacy_of(job, rnd)  # raises PrivacyBudgetSpent past the budget
        self.plans[spec.name] = plan
        await self._publish(job, rnd, plan)
        if spend is not None:  # the round's clients now train: its privacy is spent
            job.privacy_rates.append(spend[0])
            job.privacy["spent"] = spend[1]
        # only now do assignments (which take no lock) answer for the round: a client sent to
        # a gateway before its plan arrived there would be refused as on the "wrong node"
        job.current = rnd
        log.info(
            "job %s round %d open: %d clients on %d nodes",
            spec.name,
            rnd.number,
            len(rnd.selected),
            len(set(rnd.assignment.values())),
        )
        return rnd

    async def _open_next(self, job: JobState) -> None:
        """Open the job's next round, unless its privacy budget ends the job instead."""
        try:
            await self._open_round(job)
        except PrivacyBudgetSpent as exc:
            log.warning("job %s: %s", job.spec.name, exc.detail)

    def _privacy_of(self, job: JobState, rnd: RoundInfo) -> tuple[float, float] | None:
        """A DP job's round about to open: ``(its sampling rate, the epsilon spent once it
        has)``, or :class:`PrivacyBudgetSpent` (the job stopped) when that passes the budget.
        The rate is the selected share of the eligible clients for a random selection, 1 for
        any other (no amplification by sampling: :mod:`core.privacy`). None without DP."""
        p = job.privacy
        if not p:
            return None
        pool = len(job.selectable())
        q = len(rnd.selected) / pool if job.spec.selection == "random" and pool else 1.0
        eps = privacy.epsilon(p["noise_multiplier"], [*job.privacy_rates, q], p["delta"])
        budget = p.get("epsilon")
        if budget is not None and eps > budget:
            job.stopped = (
                f"privacy budget: round {rnd.number} would bring epsilon to {eps:.4g} "
                f"(delta {p['delta']:g}), past the budget {budget:g}; "
                f"{p.get('spent', 0.0):.4g} spent over {len(job.privacy_rates)} round(s)"
            )
            raise PrivacyBudgetSpent(f"job {job.spec.name!r} stopped: {job.stopped}")
        return q, eps

    def plan_round(
        self, job: JobState, nodes: list[str], selection: Selection | None = None
    ) -> tuple[RoundInfo, Plan]:
        """The job's next round, decided but not sent: its clients (``selection``, by default
        ``ceil(goal * overprovision)`` of the eligible ones at random, seeded by job and round)
        placed on ``nodes`` and the hierarchy planned. Pure computation (``make bench-control``
        times it)."""
        spec, number = job.spec, job.completed + 1
        pool = job.selectable()
        if not pool:
            raise RoundStateError(
                f"every client of job {spec.name!r} was revoked or flagged by FLStore"
            )
        if selection is None:
            selection = random_selection(pool, self._wanted(job), seed_of(spec.name, number))
        selected = selection.clients
        assignment = self._place(spec, selected, nodes, {})
        now = self.clock()
        goal = min(spec.goal, len(pool))  # a forced revocation may have left fewer clients
        rnd = RoundInfo(number, "open", goal, selected, assignment, now, now + spec.deadline_s)
        rnd.selected_by, rnd.selection_note = selection.method, selection.note
        gone = set(job.revoked)
        rnd.excluded = {c: dict(why) for c, why in job.flagged.items() if c not in gone}
        plan = self._plan_for(job, rnd)
        rnd.plan_version = plan.version
        return rnd, plan

    @staticmethod
    def _wanted(job: JobState) -> int:
        """Clients a round selects: ``ceil(goal * overprovision)``, at most the selectable."""
        want = math.ceil(job.spec.goal * job.spec.overprovision - 1e-9)
        return min(len(job.selectable()), want)

    async def _drop_flagged(self, job: JobState) -> str:
        """The debugging loop (``drop_flagged``): before round ``n >= 2``, add the clients
        FLStore's workload flags in round ``n - 1`` to the job's ``flagged`` (out of every
        later round). Returns why no answer came ("" when one did, or for no such job)."""
        spec, number = job.spec, job.completed + 1
        d = spec.drop_flagged
        if d is None or number < 2:
            return ""
        workload = str(d["workload"])
        if self.scheduler is None:
            return "no request tracker configured (--tracker, --tracker-token-file)"
        try:
            flagged = await self.scheduler.flagged(
                spec.name, number - 1, workload, dict(d.get("params") or {})
            )
        except SchedulerUnavailable as exc:
            log.warning(
                "job %s round %d: no %s answer, no new flags: %s", spec.name, number, workload, exc
            )
            return str(exc)
        known, kept = set(spec.clients), []
        for c in flagged:
            if c in known and c not in job.flagged:
                if len(job.selectable()) <= spec.goal:  # never fewer than the goal
                    kept.append(c)
                    continue
                job.flagged[c] = {"flagged_in": number - 1, "workload": workload}
                log.warning(
                    "job %s: FLStore's %s flagged %s in round %d; dropped from round %d on",
                    spec.name,
                    workload,
                    c,
                    number - 1,
                    number,
                )
        if kept:
            return (
                f"{workload} flagged {', '.join(kept)} in round {number - 1}, kept: dropping "
                f"them would leave fewer than the goal of {spec.goal} clients"
            )
        return ""

    async def _select(self, job: JobState) -> Selection | None:
        """The next round's clients when the job asks for Oort and the round has history
        (None: random, :meth:`plan_round`'s default); random with a note when the tracker
        cannot answer (:mod:`control_plane.selection`)."""
        spec, number = job.spec, job.completed + 1
        if spec.selection != "oort" or number < 2:
            return None
        pool, want, seed = job.selectable(), self._wanted(job), seed_of(spec.name, number)
        if not pool:
            return None  # plan_round says why
        if self.scheduler is None:
            why = "no request tracker configured (--tracker, --tracker-token-file)"
            return random_selection(pool, want, seed, why)
        try:
            clients = await self.scheduler.select(spec.name, number, pool, want, seed)
        except SchedulerUnavailable as exc:
            log.warning("job %s round %d: oort unavailable, random: %s", spec.name, number, exc)
            return random_selection(pool, want, seed, str(exc))
        return Selection(clients, "oort")

    async def _publish(self, job: JobState, rnd: RoundInfo, plan: Plan) -> None:
        """Send the slot table to the job's gateways (all at once) and scale the aggregator
        function.

        Gateways that do not take plans keep their own static plan; then the assignment must
        follow their client -> node table or they reject uploads as "wrong node". A gateway
        that missed the plan gets it again from the poll that sees it run another
        (:meth:`_repush`).
        """
        slots = plan_to_slots(plan, rnd.assignment, rnd.slot_ids, rnd.excluded)
        nodes = self._job_nodes(job) if self.push_plans else []
        name = job.spec.name
        taken = 0
        for n, ans in (
            await self.on_nodes(nodes, lambda c: c.put_plan(name, rnd.number, slots))
        ).items():
            if isinstance(ans, ControlPlaneError):
                log.warning("plan for %s not delivered to %s: %s", name, n, ans.detail)
            else:
                taken += ans
        if taken:
            rnd.placement = "coordinator"
        elif job.gateway_client_nodes:
            healthy = set(self.healthy_nodes())
            rnd.assignment = {
                c: (
                    job.gateway_client_nodes.get(c, n)
                    if job.gateway_client_nodes.get(c) in healthy
                    else n
                )
                for c, n in rnd.assignment.items()
            }
            rnd.placement = "gateway-static"
            self.plans[name] = self._plan_for(job, rnd)

    async def _repush(self, job: JobState, rnd: RoundInfo, node: str, st: GatewayJobStatus) -> None:
        """Send the open round's plan again to a gateway that runs another one: it missed the
        push (it was restarting then) and opened the round on its own plan, which would refuse
        the clients placed on it as on the "wrong node" until the deadline."""
        plan = self.plans.get(job.spec.name)
        if (
            plan is None
            or not self.push_plans
            or rnd.placement != "coordinator"
            or not st.reports_version  # a gateway that says nothing of its plans
            or st.plan_version == rnd.plan_version
        ):
            return
        slots = plan_to_slots(plan, rnd.assignment, rnd.slot_ids, rnd.excluded)
        try:
            if not await self.clients[node].put_plan(job.spec.name, rnd.number, slots):
                return
            log.warning(
                "job %s round %d: %s ran plan v%s, not v%s; sent it again",
                job.spec.name,
                rnd.number,
                node,
                st.plan_version,
                rnd.plan_version,
            )
        except ControlPlaneError as exc:
            log.warning(
                "plan for %s not delivered to %s again: %s", job.spec.name, node, exc.detail
            )
