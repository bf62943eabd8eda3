"""The LIFL coordinator: jobs, rounds, client -> node assignment, node health, autoscaling.

One :class:`Coordinator` drives any number of node gateways over HTTP. Its pure decisions
come from :mod:`~control_plane.placement`, :mod:`~control_plane.planning` and
:mod:`~control_plane.reuse`; this module only keeps state and talks to the outside.

Enrollment: a job's clients enroll (:meth:`Coordinator.enroll`), at its creation or later;
round 1 opens once ``goal`` of them are enrolled. The gateways get no client list: each
round's clients come with the round's plan, and the gateways admit them from it.

Round lifecycle: ``open`` (clients selected: ``ceil(goal * overprovision)`` of the job's
enrolled clients less those that left or were revoked, at random seeded by job and round, or
by Oort's utility from FLStore with ``selection="oort"`` (:mod:`control_plane.selection`);
placed on healthy nodes; hierarchy planned; plan sent to the gateways; aggregator function
scaled) -> ``aggregating`` once the healthy gateways report
``goal`` accepted updates (only with gateways that report a model version; assignments now
answer 409) -> ``closed`` when a gateway reports the round's model published (or at goal,
for gateways without versions). The gateways reject the round's late updates (their
stale-round / round-full checks). With ``auto_rounds`` the next round opens until ``rounds``
are done.

Deadlines: at a round's deadline, if at least the job's ``min_updates`` arrived, the round is
closed on the gateways with what arrived (``expired`` once its model is published); if fewer
did, it gets another deadline (``on_shortfall="reopen"``, at most ``max_reopens`` times; its
``reopened`` count is in the round's view) or the job fails: the round ends ``failed``, the
job's ``failed`` says why, the gateways drop the job's live state (no gateway is left waiting
on the round), and assignments answer 409 ``job_failed``. A round closed but without a
published model a further deadline later fails the job the same way.

Central DP: a job whose initial weights declare ``dp-fedavg`` (``fedfaas.robust``) is accounted
here (:mod:`fedfaas.privacy`): before a round opens, the epsilon its clients' sampling rate
would bring the job to is computed; past the job's budget the round does not open and the job
ends (``stopped`` in its view, 409 ``privacy_budget_spent`` to an explicit open). The view's
``privacy`` and ``GET /metrics`` show the epsilon spent.

Plans: every plan (and re-plan) goes to the gateways as a slot table (``PUT .../plan``, slot
ids stable within a round, the top on the job's root node). Gateways that answer 404/405
keep their static plan and the assignment follows theirs (``placement: "gateway-static"``).
With over-provisioning the plan covers every selected client, so at goal (and at the
deadline) the round is closed early on the gateways (``POST .../close``: intake stops, then
the goals drop to the counts each node holds) and the top publishes from those updates.

Node health: a gateway failing ``health_failures`` consecutive ``/healthz`` probes for at
least ``node_grace_s`` seconds is taken out of placement (a gateway process that restarts,
as the platform's supervisor or a kubelet restarts it, is back well within the grace and
resumes its rounds from its journal and shared memory). If the surviving nodes of an open round hold updates, the round is closed
on them: its goal drops to what reached them, the updates the dead node had accepted are
lost with its shared memory (counted in ``lost``, logged), and the round completes with
the exact FedAvg of the survivors' updates. If they hold none yet (or the gateways cannot
close rounds), the dead node's clients are placed again on the others, the plan is
re-planned (:func:`replan`) and pushed, and the round goes on. The job's root node holds
the global model and the top: when it is the one lost, another node of the job first adopts
the job (:meth:`Coordinator._take_over`, :mod:`gateway.takeover`), the clients whose updates
died with it are told to send them again (the round's ``resend``, in their assignment), its
other clients are placed again, and the round goes on with the top on the new root.

Nodes found later: :meth:`Coordinator.update_nodes` (fed by :mod:`fedfaas.discovery` when
the service runs with ``gateways_service``) adds new nodes to placement and points a known
node whose address changed (a restarted pod) at its new URL. Nodes are never dropped by it:
one that stops answering leaves placement through the health probes above.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from control_plane.autoscale import NodeLoad, ScaleBounds, replicas_wanted
from control_plane.errors import (
    ClientNotSelected,
    ClientRevoked,
    ControlPlaneError,
    GatewayError,
    InvalidInput,
    JobExists,
    JobFailed,
    NoHealthyNodes,
    PrivacyBudgetSpent,
    RoundStateError,
    TooFewClients,
    UnknownClient,
    UnknownJob,
)
from control_plane.gateways import GatewayClient, GatewayJobStatus, plan_to_slots
from control_plane.jobs import (
    CLIENT_ID,
    MAX_CLIENTS,
    JobSpec,
    JobState,
    NodeHealth,
    RoundInfo,
    delivered_per_leaf,
    job_from_json,
    job_to_json,
    round_view,
    seed_of,
)
from control_plane.placement import place
from control_plane.planning import Plan, QueueEstimator, plan_hierarchy, replan
from control_plane.selection import (
    OortScheduler,
    SchedulerUnavailable,
    Selection,
    random_selection,
)
from control_plane.store import MemoryStore, StateStore
from fedfaas import privacy, robust, wire
from fedfaas.auth import client_token, enrollment_token
from fedfaas.openfaas import AsyncOpenFaaS, FunctionStatus, OpenFaaSError

log = logging.getLogger(__name__)


class Coordinator:
    """Keeps jobs and rounds, answers assignments, tracks nodes, scales aggregators.

    Parameters
    ----------
    gateways
        Node name -> gateway base URL; may be empty when nodes come from :meth:`update_nodes`
        (then creating a job answers :class:`NoHealthyNodes` until one does).
    mc
        Maximum service capacity per node (one number for all, or per node name).
    store
        Where job state lives (default: memory).
    provider
        OpenFaaS client (:class:`fedfaas.openfaas.AsyncOpenFaaS`) that scales ``function``
        (None: no autoscaling).
    scale_down_after
        Seconds every node must be idle before ``function`` scales down to its minimum.
    clock
        Wall clock in seconds (tests pass a fake one).
    """

    def __init__(
        self,
        gateways: Mapping[str, str],
        *,
        mc: float | Mapping[str, float] = 20.0,
        store: StateStore | None = None,
        provider: AsyncOpenFaaS | None = None,
        function: str = "aggregator",
        alpha: float = 0.7,
        health_failures: int = 2,
        node_grace_s: float = 0.0,
        auto_rounds: bool = True,
        admin_token: str | None = None,
        job_ready_timeout: float = 30.0,
        push_plans: bool = True,
        scale_down_after: float = 30.0,
        scheduler: OortScheduler | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._mc = mc
        self.nodes = {n: NodeHealth(n, u, self._mc_of(n)) for n, u in sorted(gateways.items())}
        self.clients = {
            n: GatewayClient(n, h.url, admin_token=admin_token) for n, h in self.nodes.items()
        }
        #: clients of nodes that moved, closed at the next :meth:`update_nodes` (or the stop),
        #: once the requests they may still carry are over
        self._retired: list[GatewayClient] = []
        self.store = store or MemoryStore()
        self.provider = provider
        self.function = function
        self.queues = QueueEstimator(alpha)
        self.health_failures = health_failures
        self.node_grace_s = node_grace_s
        self.auto_rounds = auto_rounds
        self.admin_token = admin_token
        self.job_ready_timeout = job_ready_timeout
        self.push_plans = push_plans
        self.scheduler = scheduler
        self.clock = clock
        self.jobs: dict[str, JobState] = {}
        self.plans: dict[str, Plan] = {}
        self.last_scale: int | None = None
        self.scale_error: str | None = None
        self.scale_down_after = scale_down_after
        self._busy_at = clock()
        self._reports: dict[str, dict[str, Any]] = {}
        self._lock = asyncio.Lock()

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        """Load persisted jobs (their plans are re-planned from the stored assignment)."""
        for name, raw in (await self.store.load_all()).items():
            try:
                job = job_from_json(raw)
            except (KeyError, TypeError, ValueError) as exc:
                log.warning("skipping unreadable stored job %s: %s", name, exc)
                continue
            self.jobs[name] = job
            if job.current is not None:
                self.plans[name] = self._plan_for(job, job.current)
        log.info("coordinator up: %d nodes, %d jobs loaded", len(self.nodes), len(self.jobs))

    def _mc_of(self, node: str) -> float:
        mc = self._mc
        return float(mc if isinstance(mc, int | float) else mc.get(node, 20.0))

    async def update_nodes(self, found: Mapping[str, str]) -> None:
        """Take in node gateways found at run time (``{node: url}``, e.g. by discovery).

        A new node joins placement (healthy: it just answered); a known node at another URL
        is reached there from now on (its old connection pool is closed a call later). Nodes
        missing from ``found`` stay: the health probes decide about them.
        """
        async with self._lock:
            retired, self._retired = self._retired, []
            for c in retired:
                await c.aclose()
            for node, url in sorted(found.items()):
                url = url.rstrip("/")
                h = self.nodes.get(node)
                if h is not None and h.url == url:
                    continue
                if h is None:
                    log.info("node %s found at %s: in placement", node, url)
                    self.nodes[node] = NodeHealth(node, url, self._mc_of(node))
                else:
                    log.info("node %s moved from %s to %s", node, h.url, url)
                    h.url = url
                    self._retired.append(self.clients[node])
                self.clients[node] = GatewayClient(node, url, admin_token=self.admin_token)
            self.nodes = dict(sorted(self.nodes.items()))

    async def stop(self) -> None:
        """Close connections."""
        for c in [*self.clients.values(), *self._retired]:
            await c.aclose()
        if self.provider is not None:
            await self.provider.aclose()
        if self.scheduler is not None:
            await self.scheduler.aclose()
        await self.store.aclose()

    def healthy_nodes(self) -> list[str]:
        """Names of nodes in placement, sorted."""
        return [n for n, h in self.nodes.items() if h.healthy]

    def job(self, name: str) -> JobState:
        """The job or :class:`UnknownJob`."""
        try:
            return self.jobs[name]
        except KeyError:
            raise UnknownJob(name) from None

    # ------------------------------------------------------------------ jobs and rounds
    async def create_job(
        self, spec: JobSpec, *, initial_weights: bytes = b"", open_first_round: bool = True
    ) -> JobState:
        """Validate, create the job on the gateways, and (by default) open round 1.

        The job is created on the nodes its first round is placed on, busiest first (the
        root, :meth:`_job_span`), with ``initial_weights`` and the admin token, then on the
        others (a gateway that learns jobs from its journal answers "create it on the root",
        which is fine). A job that already exists on a gateway is attached to.
        """
        spec.validate()
        try:
            rule = robust.declared(initial_weights) if initial_weights else None
        except (robust.RuleError, wire.WireError) as exc:
            raise InvalidInput(f"aggregation: {exc}") from None
        async with self._lock:
            if spec.name in self.jobs:
                raise JobExists(spec.name)
            nodes = self.healthy_nodes()
            if not nodes:
                raise NoHealthyNodes()
            job = JobState(spec, rule="" if rule is None else rule.rule)
            if rule is not None and rule.rule == "dp-fedavg":
                job.privacy = {
                    "noise_multiplier": rule.noise_multiplier,
                    "clip": rule.clip,
                    "delta": rule.delta,
                    "epsilon": rule.epsilon,
                    "spent": 0.0,
                }
            span = self._job_span(spec, nodes)
            if job.rule:  # every update of a round on the node that reduces them
                span = span[:1]
            elif self.push_plans:
                # every healthy node learns the job (a re-plan may move clients anywhere);
                # gateways with static plans spread clients over all of them. The busiest is
                # its root: it must hold the job before the others hear of it
                span = [*span, *(x for x in nodes if x not in span)]
            job.root = span[0]
            for n in span:
                # no client list: the gateways admit each round's clients from its plan; ones
                # that keep their own plans (push_plans off: a benchmark's baseline) need the
                # clients enrolled at creation, and only those can take part
                outcome, answer = await self.clients[n].create_job(
                    spec.name,
                    spec.rounds,
                    spec.goal,
                    [] if self.push_plans else spec.clients,
                    nodes=span,
                    body=initial_weights,
                )
                if n == job.root and isinstance(answer.get("salt"), str):
                    job.salt = answer["salt"]
                plan = answer.get("plan")
                if outcome == "created" and isinstance(plan, dict):
                    job.gateway_slots = len(plan.get("slots") or ())
                    cn = plan.get("client_nodes")
                    if isinstance(cn, dict) and cn:
                        job.gateway_client_nodes = {str(k): str(v) for k, v in cn.items()}
                log.info("job %s on %s: %s", spec.name, n, outcome)
            await self._wait_known(spec.name, span)
            if not job.salt:  # attached to a job created before: its root shows the admin
                job.salt = (await self.clients[job.root].job_status(spec.name)).salt or ""
            self.jobs[spec.name] = job
            if open_first_round and len(job.eligible()) >= spec.goal:
                await self._open_next(job)  # else at the enrollment that reaches the goal
            await self._save(job)
            return job

    async def enroll(self, name: str, clients: Sequence[str]) -> dict[str, str]:
        """Enroll ``clients`` in job ``name`` (idempotent: an enrolled one keeps its place);
        returns each one's bearer token. Round 1 opens at the enrollment that brings the
        job's clients to its ``goal``.

        Raises :class:`InvalidInput` for an id that is not one, :class:`ClientRevoked` for
        a client that left or was revoked (it may not come back).
        """
        bad = [c for c in clients if not CLIENT_ID.match(c)]
        if bad:
            raise InvalidInput(
                f"client ids must be 1-64 characters of A-Z, a-z, 0-9, '_', '.', '-' "
                f"(bad: {bad[:3]})"
            )
        async with self._lock:
            job = self.job(name)
            gone = set(job.revoked).intersection(clients)
            if gone:
                raise ClientRevoked(name, sorted(gone)[0])
            known = set(job.spec.clients)
            new = [c for c in dict.fromkeys(clients) if c not in known]
            if len(known) + len(new) > MAX_CLIENTS:
                raise InvalidInput(f"a job has at most {MAX_CLIENTS} clients")
            job.spec.clients.extend(new)
            if new:
                await self._save(job)
            await self._open_first_round(job)
        tokens = self.client_tokens(name, clients)
        log.info("job %s: %d client(s) enrolled, %d in all", name, len(new), len(known) + len(new))
        return tokens

    async def _open_first_round(self, job: JobState) -> None:
        """Open round 1 of a job waiting for its clients once ``goal`` of them enrolled (a
        failure is logged: the control loop tries again)."""
        if job.current is not None or job.done or job.failed or not self.auto_rounds:
            return
        if len(job.eligible()) < job.spec.goal:
            return
        try:
            await self._open_round(job)
        except ControlPlaneError as exc:
            log.warning("job %s: round 1 not opened yet: %s", job.spec.name, exc.detail)
        await self._save(job)

    async def delete_job(self, name: str) -> None:
        """Forget a job, and delete it on the healthy gateways: a job created again under the
        same name is then a new one (new salt), which refuses the old clients' tokens. A
        gateway that cannot be reached keeps its copy (logged)."""
        async with self._lock:
            job = self.job(name)
            self.jobs.pop(name)
            self.plans.pop(name, None)
            await self.store.delete(name)
            # the others first: the root deletes the journal that they would load it from
            for n in sorted(self.healthy_nodes(), key=lambda x: x == job.root):
                try:
                    await self.clients[n].delete_job(name)
                except ControlPlaneError as exc:
                    log.warning("job %s: not deleted on %s: %s", name, n, exc.detail)

    def salt_of(self, name: str) -> str | None:
        """The job's salt (the control plane's client-token check), None for an unknown job."""
        job = self.jobs.get(name)
        return job.salt if job is not None and job.salt else None

    def client_tokens(self, name: str, clients: Sequence[str] | None = None) -> dict[str, str]:
        """The bearer token of each of ``clients`` (default: every eligible client); empty
        when the job's salt or the admin token is unknown."""
        job = self.job(name)
        if not job.salt or not self.admin_token:
            return {}
        ids = job.eligible() if clients is None else clients
        return {c: client_token(self.admin_token, name, job.salt, c) for c in ids}

    def enrollment_token(self, name: str) -> str | None:
        """The token the job's owner hands out to let clients enroll (``POST
        /v1/jobs/{job}/clients``); None when the job's salt or the admin token is unknown."""
        job = self.job(name)
        if not job.salt or not self.admin_token:
            return None
        return enrollment_token(self.admin_token, name, job.salt)

    async def revoke_client(self, name: str, client: str, *, force: bool = False) -> dict[str, Any]:
        """Revoke one client (idempotent): every healthy gateway of the job refuses its uploads
        and model reads (told here; one that is down learns it from the shared journal), the
        assignment refuses it (403) and it is never selected again.

        The job's rounds still need ``goal`` updates: revoking a client that would leave fewer
        clients than that answers :class:`TooFewClients` (409) and changes nothing, unless
        ``force``; then the goal of the rounds drops to the clients left. If the client was
        selected for the open round and the round's other selected clients cannot reach its
        goal, the open round's goal drops to them.
        """
        async with self._lock:
            job = self.job(name)
            if client not in job.spec.clients:
                raise UnknownClient(name, client)
            left = [c for c in job.eligible() if c != client]
            if client not in job.revoked and len(left) < job.spec.goal and not force:
                raise TooFewClients(
                    f"revoking {client!r} leaves {len(left)} clients for job {name!r}, whose "
                    f"rounds need {job.spec.goal} updates; add ?force=true to revoke it anyway "
                    f"(the goal then drops to the clients left)"
                )
            told = [
                n for n in self.healthy_nodes() if await self.clients[n].revoke_client(name, client)
            ]
            if not told:
                raise GatewayError(job.root, f"no healthy gateway knows job {name!r}")
            if client not in job.revoked:
                job.revoked.append(client)
            rnd = job.current
            if rnd is not None and rnd.state in ("open", "aggregating"):
                selected = [c for c in rnd.selected if c not in job.revoked]
                rnd.goal = max(1, min(rnd.goal, len(selected)))
            await self._save(job)
            log.warning("job %s: client %s revoked (told %s)", name, client, ", ".join(told))
            return {"job": name, "client": client, "revoked": list(job.revoked), "gateways": told}

    async def open_round(self, name: str) -> RoundInfo:
        """Open the job's next round; 409 while one is open or when all rounds are done."""
        async with self._lock:
            job = self.job(name)
            try:
                return await self._open_round(job)
            finally:  # a refusal may have stopped the job or recorded flags
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
        any other (no amplification by sampling: :mod:`fedfaas.privacy`). None without DP."""
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

    async def _wait_known(self, name: str, nodes: list[str]) -> None:
        """Wait until every gateway of the job's span knows it (others learn it from the root's
        journal a moment later), so no client is sent to a gateway that answers 404."""
        deadline = self.clock() + self.job_ready_timeout
        for n in nodes:
            while not await self.clients[n].has_job(name):
                if self.clock() > deadline:
                    raise GatewayError(
                        n, f"job {name!r} not known there {self.job_ready_timeout}s after creation"
                    )
                await asyncio.sleep(0.02)

    def _job_span(self, spec: JobSpec, nodes: list[str]) -> list[str]:
        """Nodes a round's expected clients are placed on, the busiest first (the job's root).

        Gateways that keep a static plan spread a job evenly over the nodes it is created
        with, so handing them only these nodes keeps the placement's locality.
        """
        want = min(len(spec.clients), math.ceil(spec.goal * spec.overprovision - 1e-9))
        counts = self._place_counts(spec, want, nodes)
        used = [n for n in nodes if counts.get(n, 0) > 0]
        return sorted(used, key=lambda n: (-counts[n], nodes.index(n))) or nodes[:1]

    def _place_counts(self, spec: JobSpec, n_clients: int, nodes: list[str]) -> dict[str, int]:
        fake = [f"#{i}" for i in range(n_clients)]
        out: dict[str, int] = {}
        for node in self._place(spec, fake, nodes, {}).values():
            out[node] = out.get(node, 0) + 1
        return out

    def _place(
        self, spec: JobSpec, clients: list[str], nodes: list[str], already: Mapping[str, str]
    ) -> dict[str, str]:
        est = self.queues.estimates
        used = {n: 0.0 for n in nodes}
        for node in already.values():
            if node in used:
                used[node] += spec.size
        residual = [self.nodes[n].mc - est.get(n, 0.0) - used[n] for n in nodes]
        queue = [est.get(n, 0.0) + used[n] for n in nodes]
        pl = place(np.full(len(clients), spec.size), residual, spec.policy, queue=queue)
        if pl.overflowed.size:
            log.warning(
                "job %s: %d clients placed beyond node capacity", spec.name, pl.overflowed.size
            )
        out = dict(already)
        out.update({c: nodes[int(i)] for c, i in zip(clients, pl.assignment, strict=True)})
        return out

    def _job_nodes(self, job: JobState) -> list[str]:
        """Healthy nodes the job's rounds may use: all of them, or its root alone for a job
        whose rule needs every update on one node (``JobState.rule``)."""
        nodes = self.healthy_nodes()
        return [n for n in nodes if n == job.root] if job.rule else nodes

    def _plan_for(self, job: JobState, rnd: RoundInfo) -> Plan:
        counts: dict[str, int] = {}
        for node in rnd.assignment.values():
            counts[node] = counts.get(node, 0) + 1
        plan = plan_hierarchy(
            dict(sorted(counts.items())), job.spec.per_leaf, version=rnd.plan_version
        )
        return self._top_on_root(job, plan)

    def _top_on_root(self, job: JobState, plan: Plan) -> Plan:
        """The top runs where the model is published: the job's root node (while it lives)."""
        if job.root and plan.nodes and job.root in self.healthy_nodes():
            return dataclasses.replace(plan, top_node=job.root)
        return plan

    async def _publish(self, job: JobState, rnd: RoundInfo, plan: Plan) -> None:
        """Send the slot table to the gateways and scale the aggregator function.

        Gateways that do not take plans keep their own static plan; then the assignment must
        follow their client -> node table or they reject uploads as "wrong node".
        """
        slots = plan_to_slots(plan, rnd.assignment, rnd.slot_ids, rnd.excluded)
        taken = 0
        for n in self._job_nodes(job) if self.push_plans else ():
            try:
                taken += await self.clients[n].put_plan(job.spec.name, rnd.number, slots)
            except ControlPlaneError as exc:
                log.warning("plan for %s not delivered to %s: %s", job.spec.name, n, exc.detail)
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
            self.plans[job.spec.name] = self._plan_for(job, rnd)

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

    async def autoscale(self, reports: Mapping[str, dict[str, Any]]) -> None:
        """Scale ``function`` to what the nodes' aggregator loads ask for (see
        :mod:`control_plane.autoscale`): up when a node lacks endpoints, down to the minimum
        after ``scale_down_after`` idle seconds."""
        if self.provider is None:
            return
        loads = [node_load(n, body) for n, body in reports.items()]
        now = self.clock()
        if not loads or not all(x.idle for x in loads):  # no report is no evidence of idling
            self._busy_at = now
        try:
            st = await self.provider.function(self.function)
            if st is None:
                raise OpenFaaSError(f"function {self.function!r} is not deployed", 404)
            lo, hi = st.scale_bounds()
            want = replicas_wanted(
                loads,
                desired=st.replicas,
                available=st.available_replicas,
                endpoints_per_replica=endpoints_per_replica(st),
                bounds=ScaleBounds(lo, hi),
                idle_for_s=now - self._busy_at,
                idle_s=self.scale_down_after,
            )
            if want != st.replicas:
                await self.provider.scale(self.function, want)
                log.info(
                    "%s: %d -> %d replicas (short of %s endpoints; per node endpoints/free/"
                    "waiting slots/queue %s)",
                    self.function,
                    st.replicas,
                    want,
                    {x.node: x.shortage for x in loads if x.shortage},
                    {
                        x.node: f"{x.endpoints}/{x.free_endpoints}/{x.waiting_slots}/{x.queue:.2f}"
                        for x in loads
                    },
                )
            self.last_scale, self.scale_error = want, None
        except OpenFaaSError as exc:
            self.scale_error = exc.detail
            log.warning("autoscale of %s failed: %s", self.function, exc.detail)

    def assignment(self, name: str, client: str) -> tuple[int, str, str, int]:
        """``(round, node, gateway_url, resend)`` for a client of the open round. ``resend``
        is not 0 when the client's update of this round was accepted by a root node that died
        (:meth:`_take_over`): the client sends it again, once per takeover (the number
        grows), to the node named."""
        job = self.job(name)
        if job.failed:
            raise JobFailed(name, job.failed)
        if job.stopped:  # the gateways keep its last model; no round opens again
            raise PrivacyBudgetSpent(f"job {name!r} was stopped: {job.stopped}")
        if client in job.revoked:
            raise ClientRevoked(name, client)
        rnd = job.current
        if rnd is None or rnd.state != "open":
            raise ClientNotSelected(name, client, None)
        node = rnd.assignment.get(client)
        if node is None:
            raise ClientNotSelected(name, client, rnd.number)
        h = self.nodes.get(node)
        if h is None:  # a restarted service whose discovery has not found that node yet
            raise NoHealthyNodes()
        return rnd.number, node, h.url, rnd.resend.get(client, 0)

    async def close_round(self, name: str, state: str = "closed") -> RoundInfo:
        """Close the open round (``closed`` at goal, ``expired`` at the deadline)."""
        async with self._lock:
            job = self.job(name)
            rnd = await self._close(job, state)
            await self._save(job)
            return rnd

    async def _close(self, job: JobState, state: str) -> RoundInfo:
        rnd = job.current
        if rnd is None or rnd.state not in ("open", "aggregating"):
            raise RoundStateError(f"job {job.spec.name!r} has no open round to close")
        rnd.state, rnd.closed_at = state, self.clock()
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

    # ------------------------------------------------------------------ periodic work
    async def tick(self) -> None:
        """One control period: health probes, autoscaling, progress polls, round closing."""
        await self.check_health()
        await self.autoscale(self._reports)
        await self.poll()

    async def check_health(self) -> dict[str, bool]:
        """Probe every gateway's /healthz; take failing ones out, bring recovered ones back."""
        clients = dict(self.clients)  # update_nodes may add nodes meanwhile
        results = await asyncio.gather(*(c.healthz() for c in clients.values()))
        self._reports = {n: r for n, r in zip(clients, results, strict=True) if r is not None}
        async with self._lock:
            for name, body in zip(clients, results, strict=True):
                h = self.nodes[name]
                if body is not None:
                    if not h.healthy:
                        log.info("node %s is back in placement", name)
                    h.healthy, h.failures, h.failing_since = True, 0, None
                    continue
                h.failures += 1
                now = self.clock()
                h.failing_since = now if h.failing_since is None else h.failing_since
                if (
                    h.healthy
                    and h.failures >= self.health_failures
                    and now - h.failing_since >= self.node_grace_s
                ):
                    h.healthy = False
                    log.warning("node %s stopped answering /healthz: out of placement", name)
                    self.queues.forget(name)
                    await self._evacuate(name)
        return {n: h.healthy for n, h in self.nodes.items()}

    async def _evacuate(self, dead: str) -> None:
        nodes = self.healthy_nodes()
        for job in self.jobs.values():
            taken = False
            if job.root == dead and not job.failed and not job.done and nodes:
                taken = await self._take_over(job, dead, nodes)
                if job.failed:
                    continue
            rnd = job.current
            if rnd is None or rnd.state not in ("open", "aggregating"):
                continue
            lost = rnd.received.pop(dead, 0)
            if taken:
                lost = 0  # the clients whose updates the dead root held send them again
                await self._refresh_received(job, rnd, nodes)  # the leaves' counts, for replan
            elif rnd.placement == "coordinator" and nodes and rnd.closing is None:
                await self._refresh_received(job, rnd, nodes)
                if sum(rnd.received.values()) > 0 and await self._shrink_round(
                    job, rnd, f"node_lost:{dead}", nodes
                ):
                    rnd.lost += lost
                    log.warning(
                        "job %s round %d: node %s died holding %d accepted update(s) (as of the "
                        "last poll); they are lost with its shared memory. The round's goal is "
                        "lowered to the %d update(s) that reached %s",
                        job.spec.name,
                        rnd.number,
                        dead,
                        lost,
                        sum(rnd.closed_with.values()),
                        ", ".join(sorted(rnd.closed_with)),
                    )
                    await self._save(job)
                    continue
            rnd.lost += lost
            if rnd.state == "aggregating" and sum(rnd.received.values()) < rnd.goal:
                rnd.state = "open"  # updates were lost with the node: take more
            moved = sorted(c for c, n in rnd.assignment.items() if n == dead)
            if not nodes:
                continue
            keep = {c: n for c, n in rnd.assignment.items() if n != dead}
            rnd.assignment = self._place(job.spec, moved, nodes, keep)
            old = self.plans.get(job.spec.name) or self._plan_for(job, rnd)
            counts: dict[str, int] = {}
            for n in rnd.assignment.values():
                counts[n] = counts.get(n, 0) + 1
            delivered = delivered_per_leaf(old, rnd.received)
            # a leaf holding its whole goal has finished, or will with that goal: it keeps it
            # (a gateway refuses a plan that changes a finished slot's goal)
            full = [
                f"{n.node}:leaf:{k}"
                for n in old.nodes
                for k, g in zip(n.leaf_numbers, n.leaf_goals, strict=True)
                if delivered.get(f"{n.node}:leaf:{k}", 0) >= g
            ]
            plan = self._top_on_root(job, replan(old, counts, delivered, full))
            self.plans[job.spec.name] = plan
            rnd.plan_version = plan.version
            await self._publish(job, rnd, plan)
            await self._save(job)
            log.warning(
                "job %s round %d: node %s lost with %d accepted update(s); %d clients moved off it",
                job.spec.name,
                rnd.number,
                dead,
                lost,
                len(moved),
            )

    async def _take_over(self, job: JobState, dead: str, nodes: list[str]) -> bool:
        """Have a surviving node adopt ``job`` from its dead root ``dead``
        (:mod:`gateway.takeover`): the node of the job holding most of the open round's
        updates, else the next. The clients whose updates were lost with ``dead`` are marked
        to send them again (:attr:`RoundInfo.resend`). False when no node could: the job
        fails if its model is lost; gateways without the adopt route leave the round to the
        plain evacuation of a dead node."""
        name, rnd = job.spec.name, job.current
        held: list[tuple[int, str]] = []
        for n in nodes:
            try:
                st = await self.clients[n].job_status(name)
            except ControlPlaneError as exc:
                log.debug("takeover of %s: %s does not have it (%s)", name, n, exc.detail)
                continue
            held.append((st.received if rnd is not None and st.round == rnd.number else 0, n))
        for _, n in sorted(held, key=lambda x: (-x[0], x[1])):
            try:
                ans = await self.clients[n].adopt(name, dead)
            except GatewayError as exc:
                if exc.error == "model_lost":
                    await self._fail(job, f"root node {dead} died and {exc.detail}")
                    await self._save(job)
                    return False
                log.warning("job %s: %s could not take it over: %s", name, n, exc.detail)
                continue
            job.root = n
            if rnd is not None and ans.get("round") == rnd.number:
                rnd.takeovers += 1
                for c in ans["resend"]:
                    rnd.resend[str(c)] = rnd.takeovers
                if rnd.state == "aggregating":
                    rnd.state = "open"  # the resent updates are still to come
            log.warning(
                "job %s: node %s took it over from dead root %s (model version %s); %d "
                "client(s) send their update of round %s again",
                name,
                n,
                dead,
                ans.get("version"),
                len(ans["resend"]),
                ans.get("round"),
            )
            await self._save(job)
            return True
        log.error("job %s: no surviving node could take it over from %s", name, dead)
        return False

    async def _refresh_received(self, job: JobState, rnd: RoundInfo, nodes: list[str]) -> None:
        for n in nodes:
            try:
                st = await self.clients[n].job_status(job.spec.name)
            except ControlPlaneError as exc:
                log.debug("refresh %s: %s", n, exc.detail)
                continue
            if st.round == rnd.number:
                rnd.received[n] = st.received

    async def _shrink_round(
        self, job: JobState, rnd: RoundInfo, why: str, nodes: list[str] | None = None
    ) -> bool:
        """Close the round's intake on ``nodes`` and have them aggregate what reached them.

        Two steps: every gateway stops taking updates and says how many it holds; then every
        gateway gets those counts and lowers its plan's goals to them (nodes left out, e.g.
        a dead one, count 0). False (nothing changed) when a gateway has no close route or
        nothing arrived anywhere.
        """
        nodes = nodes or self._job_nodes(job)
        name, counts = job.spec.name, {}
        for n in nodes:
            try:
                ans = await self.clients[n].close_round(name, rnd.number, None)
            except ControlPlaneError as exc:
                log.warning(
                    "job %s round %d: close on %s failed: %s", name, rnd.number, n, exc.detail
                )
                return False
            if ans is None:
                return False
            counts[n] = int(ans.get("received", 0))
        if sum(counts.values()) == 0:
            log.warning(
                "job %s round %d: nothing arrived; cannot close it (%s)", name, rnd.number, why
            )
            return False
        for n in nodes:
            try:
                await self.clients[n].close_round(name, rnd.number, counts)
            except ControlPlaneError as exc:
                log.error(
                    "job %s round %d: close on %s failed: %s", name, rnd.number, n, exc.detail
                )
                return False
        old = self.plans.get(name) or self._plan_for(job, rnd)
        plan = self._top_on_root(job, replan(old, counts, delivered_per_leaf(old, counts)))
        self.plans[name] = plan
        rnd.plan_version = plan.version
        rnd.received, rnd.closed_with, rnd.closing = dict(counts), dict(counts), why
        rnd.state = "aggregating"
        log.info(
            "job %s round %d closed early (%s): aggregating %d updates %s",
            name,
            rnd.number,
            why,
            sum(counts.values()),
            counts,
        )
        return True

    async def poll(self) -> None:
        """Read each healthy gateway's job status; close rounds at goal or deadline."""
        for job in list(self.jobs.values()):
            rnd = job.current
            if rnd is None:
                async with self._lock:
                    await self._open_first_round(job)
                continue
            if rnd.state not in ("open", "aggregating"):
                continue
            queues: dict[str, float] = {}
            published = False
            versioned = False
            for n in self.healthy_nodes():
                try:
                    st = await self.clients[n].job_status(job.spec.name)
                except ControlPlaneError as exc:
                    log.debug("poll %s: %s", n, exc.detail)
                    continue
                queues[n] = st.queue
                versioned = versioned or st.reports_version
                if st.round == rnd.number and st.version < rnd.number and rnd.closing is None:
                    rnd.received[n] = st.received  # after closing, the counts are fixed
                    await self._repush(job, rnd, n, st)
                # a gateway past this round (or holding its model) published it: goal met
                published = published or st.round > rnd.number or st.version >= rnd.number
                if st.last_published is not None and st.last_published[0] == rnd.number:
                    rnd.aggregated = st.last_published[1]
            self.queues.observe(queues)
            async with self._lock:
                if rnd.state not in ("open", "aggregating"):
                    continue
                at_goal = sum(rnd.received.values()) >= rnd.goal
                now = self.clock()
                if published or (at_goal and not versioned):
                    rnd.published = published
                    await self._close(job, "expired" if rnd.closing == "deadline" else "closed")
                elif at_goal and rnd.state == "open":
                    rnd.state = "aggregating"
                    log.info("job %s round %d at goal: aggregating", job.spec.name, rnd.number)
                    if rnd.placement == "coordinator" and versioned:
                        # the plan covers every selected client: aggregate the first `goal`
                        await self._shrink_round(job, rnd, "goal")
                elif now >= rnd.deadline_at and rnd.closing is None and queues:
                    # (decided only on what gateways said in this poll: none answered, none
                    # counted; a restarting gateway is asked again next tick)
                    await self._at_deadline(job, rnd, now, versioned)
                elif now >= rnd.deadline_at + job.spec.deadline_s:
                    await self._fail(
                        job,
                        f"round {rnd.number}: no global model published a deadline "
                        f"({job.spec.deadline_s:g} s) after it was closed ({rnd.closing})",
                    )
                await self._save(job)

    async def _at_deadline(
        self, job: JobState, rnd: RoundInfo, now: float, versioned: bool
    ) -> None:
        """The round's deadline passed before its goal: close it with what arrived if its
        minimum came; else give it another deadline (``on_shortfall="reopen"``, at most
        ``max_reopens`` times) or fail the job. Never a gateway left waiting on the round.

        Gateways that keep their own plan or report no model version (they cannot close a
        round or say it published) only get the round ended here, ``expired``, as before."""
        spec = job.spec
        if rnd.placement != "coordinator" or not versioned:
            await self._close(job, "expired")
            return
        got, least = sum(rnd.received.values()), min(spec.min_updates, rnd.goal)
        if got >= least:
            if not await self._shrink_round(job, rnd, "deadline"):
                await self._fail(
                    job,
                    f"round {rnd.number}: {got} update(s) arrived by the deadline, but the "
                    "gateways could not close the round on them",
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

    async def _fail(self, job: JobState, reason: str) -> None:
        """Fail the job: its open round ends ``failed`` and the gateways forget the job's live
        state (its round, objects, journal), so none waits on it; the rounds it finished stay
        checkpointed in MinIO. Clients asking for an assignment get 409 ``job_failed``."""
        rnd = job.current
        if rnd is not None and rnd.state in ("open", "aggregating"):
            rnd.state, rnd.closed_at = "failed", self.clock()
            job.record(
                {
                    "round": rnd.number,
                    "state": "failed",
                    "received": sum(rnd.received.values()),
                    "lost": rnd.lost,
                    "seconds": rnd.closed_at - rnd.opened_at,
                    "published": rnd.published,
                    "closing": rnd.closing,
                    "reason": reason,
                    "failures": dict(rnd.failures),
                }
            )
        job.failed = reason
        self.plans.pop(job.spec.name, None)
        log.error("job %s failed: %s", job.spec.name, reason)
        # the others first: the root deletes the journal that they would load it from
        for n in sorted(self.healthy_nodes(), key=lambda x: x == job.root):
            try:
                await self.clients[n].delete_job(job.spec.name)
            except ControlPlaneError as exc:
                log.warning("job %s: not dropped on %s: %s", job.spec.name, n, exc.detail)

    async def run(self, interval: float) -> None:
        """Call :meth:`tick` every ``interval`` seconds until cancelled."""
        while True:
            try:
                await self.tick()
            except Exception:  # keep the control loop alive; the error is logged
                log.exception("control tick failed")
            await asyncio.sleep(interval)

    # ------------------------------------------------------------------ views
    def job_view(self, name: str) -> dict[str, Any]:
        """JSON view of a job."""
        job = self.job(name)
        rnd = job.current
        return {
            "job": name,
            "rounds": job.spec.rounds,
            "goal": job.spec.goal,
            "completed": job.completed,
            "done": job.done,
            "failed": job.failed or None,  # why the job failed (see Coordinator._fail)
            "stopped": job.stopped or None,  # why it ended before its last round (budget)
            "privacy": privacy_view(job),
            "drop_flagged": job.spec.drop_flagged,
            "flagged": job.flagged,  # dropped from the rounds after the one that flagged them
            "policy": job.spec.policy,
            "root": job.root,  # the node that publishes the global model and runs the top
            "aggregation": job.rule or "fedavg",  # a robust rule keeps the job on its root
            "enrolled": len(job.spec.clients),
            "eligible": len(job.eligible()),  # enrolled, less those that left or were revoked
            # round 1 waits for enough clients to enroll
            "waiting_for_clients": rnd is None and not job.done and not job.failed,
            "round": None if rnd is None else round_view(rnd),
            "history": job.history,  # the newest jobs.HISTORY_ROUNDS rounds
            "totals": job.totals,  # over every ended round
        }

    async def _save(self, job: JobState) -> None:
        await self.store.save(job.spec.name, job_to_json(job))


def privacy_view(job: JobState) -> dict[str, Any] | None:
    """A DP-FedAvg job's accounting as its view shows it (None without DP)."""
    p = job.privacy
    if not p:
        return None
    return {
        "mechanism": "dp-fedavg",
        "noise_multiplier": p["noise_multiplier"],
        "clip": p["clip"],
        "delta": p["delta"],
        "budget": p.get("epsilon"),
        # spent by the rounds opened so far; without noise (z = 0) there is no bound: None
        "epsilon": spent if math.isfinite(spent := float(p.get("spent", 0.0))) else None,
        "unbounded": not math.isfinite(spent),
        "rounds": len(job.privacy_rates),
        "sampling_rates": sorted(set(job.privacy_rates)),
        "accountant": "dp-accounting RDP, Poisson-sampled Gaussian per round",
    }


def endpoints_per_replica(st: FunctionStatus) -> int:
    """Endpoints one replica of the aggregator registers: its ``FEDFAAS_AGGREGATOR_ENDPOINTS``
    as deployed (the replica's default, 2, when unset or unreadable)."""
    env = st.raw.get("envVars") or {}
    try:
        return max(1, int(env.get("FEDFAAS_AGGREGATOR_ENDPOINTS", 2)))
    except (TypeError, ValueError, AttributeError):
        return 2


def node_load(node: str, health: Mapping[str, Any]) -> NodeLoad:
    """A gateway's ``/healthz`` ``aggregators`` block as a :class:`NodeLoad` (zeros if absent)."""
    agg = health.get("aggregators") or {}

    def num(key: str) -> float:
        try:
            return float(agg.get(key) or 0)
        except (TypeError, ValueError):
            return 0.0

    return NodeLoad(
        node,
        endpoints=int(num("endpoints")),
        free_endpoints=int(num("free_endpoints")),
        waiting_slots=int(num("waiting_slots")),
        queue=num("queue"),
    )
