"""The LIFL coordinator: jobs, rounds, client -> node assignment, node health, autoscaling.

One :class:`Coordinator` drives any number of node gateways over HTTP. Its pure decisions
come from :mod:`~control_plane.placement`, :mod:`~control_plane.planning` and
:mod:`~control_plane.reuse`; the rest is split by what it does:

- this module: jobs (creation, enrollment, revocation, deletion), assignments, views, the
  control loop;
- :mod:`~control_plane.opening`: opening rounds (selection, placement, plans);
- :mod:`~control_plane.closing`: polls, closing at goal or deadline, failing a job;
- :mod:`~control_plane.failover`: node health and evacuating a lost node's jobs;
- :mod:`~control_plane.deletions`: telling every gateway, even one down at the time, that a
  job is gone;
- :mod:`~control_plane.scaling`: scaling the aggregator function;
- :mod:`~control_plane.base`: the shared state, the per-job locks and helpers.

Enrollment: a job's clients enroll (:meth:`Coordinator.enroll`), at its creation or later;
round 1 opens once ``goal`` of them are enrolled. The gateways get no client list: each
round's clients come with the round's plan, and the gateways admit them from it.

Round lifecycle: ``open`` (clients selected: ``ceil(goal * overprovision)`` of the job's
enrolled clients less those that left or were revoked, at random seeded by job and round, or
by Oort's utility from FLStore with ``selection="oort"`` (:mod:`control_plane.selection`);
placed on healthy nodes; hierarchy planned; plan sent to the gateways; aggregator function
scaled) -> ``aggregating`` once the healthy gateways report ``goal`` accepted updates (only
with gateways that report a model version; assignments now answer 409) -> ``closed`` when a
gateway reports the round's model published (or at goal, for gateways without versions).
The gateways reject the round's late updates (their stale-round / round-full checks). With
``auto_rounds`` the next round opens until ``rounds`` are done.

Deadlines: at a round's deadline, if at least the job's ``min_updates`` arrived, the round is
closed on the gateways with what arrived (``expired`` once its model is published); if fewer
did, it gets another deadline (``on_shortfall="reopen"``, at most ``max_reopens`` times; its
``reopened`` count is in the round's view) or the job fails: the round ends ``failed``, the
job's ``failed`` says why, the gateways drop the job's live state (no gateway is left waiting
on the round), and assignments answer 409 ``job_failed``. A gateway that fails its part of a
close (down a moment, 503, a timeout) is asked again, with a growing pause; the job fails only
when the close still fails ``close_retries`` times after the deadline. A round closed but
without a published model a further deadline later fails the job the same way.

Central DP: a job whose initial weights declare ``dp-fedavg`` (``core.robust``) is accounted
here (:mod:`core.privacy`): before a round opens, the epsilon its clients' sampling rate
would bring the job to is computed; past the job's budget the round does not open and the job
ends (``stopped`` in its view, 409 ``privacy_budget_spent`` to an explicit open). The view's
``privacy`` and ``GET /metrics`` show the epsilon spent.

Plans: every plan (and re-plan) goes to the gateways as a slot table (``PUT .../plan``, slot
ids stable within a round, the top on the job's root node). Gateways that answer 404/405
keep their static plan and the assignment follows theirs (``placement: "gateway-static"``).
With over-provisioning the plan covers every selected client, so at goal (and at the
deadline) the round is closed early on the gateways (``POST .../close``: intake stops, then
the goals drop to the counts each node holds) and the top publishes from those updates.

Node health (:mod:`~control_plane.failover`): a gateway failing ``health_failures``
consecutive ``/healthz`` probes for at least ``node_grace_s`` seconds is taken out of
placement and the jobs on it are evacuated: the round closes on the survivors' updates, or
its clients move, or (the root lost) another node takes the job over.

Nodes found later: :meth:`Coordinator.update_nodes` (fed by :mod:`core.discovery` when
the service runs with ``gateways_service``) adds new nodes to placement and points a known
node whose address changed (a restarted pod) at its new URL. Nodes are never dropped by it:
one that stops answering leaves placement through the health probes above.

Concurrency: each job's steps are ordered by its own lock; nothing holds a lock shared by all
jobs while it waits on a gateway (:mod:`~control_plane.base`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from control_plane import secagg
from control_plane.errors import (
    ClientNotSelected,
    ClientRevoked,
    ControlPlaneError,
    GatewayError,
    InvalidInput,
    JobBeingDeleted,
    JobExists,
    JobFailed,
    NoHealthyNodes,
    PrivacyBudgetSpent,
    TooFewClients,
    UnknownClient,
)
from control_plane.failover import NodeFailover
from control_plane.gateways import GatewayClient
from control_plane.jobs import (
    CLIENT_ID,
    MAX_CLIENTS,
    JobSpec,
    JobState,
    NodeHealth,
    job_from_json,
    privacy_view,
    round_view,
)
from control_plane.scaling import Autoscaling
from control_plane.secagg_state import record_key
from core import robust, wire
from core.auth import client_token, enrollment_token

log = logging.getLogger(__name__)


class Coordinator(NodeFailover, Autoscaling):
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
        OpenFaaS client (:class:`core.openfaas.AsyncOpenFaaS`) that scales ``function``
        (None: no autoscaling).
    scale_down_after
        Seconds every node must be idle before ``function`` scales down to its minimum.
    gateway_timeout
        Seconds one call to a gateway may take (job creation gets longer: it pre-faults the
        node's buffer pool).
    close_retries
        Failed attempts at closing a round on its gateways after its deadline before the job
        fails.
    clock
        Wall clock in seconds (tests pass a fake one).
    """

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        """Load persisted jobs (their plans are re-planned from the stored assignment) and
        the deletions still owed to gateways."""
        await self.store.wait_up()
        for name, raw in (await self.store.load_all()).items():
            try:
                job = job_from_json(raw)
            except (KeyError, TypeError, ValueError) as exc:
                log.warning("skipping unreadable stored job %s: %s", name, exc)
                continue
            self.jobs[name] = job
            if job.current is not None:
                self.plans[name] = self._plan_for(job, job.current)
        await self.load_deletions()
        log.info("coordinator up: %d nodes, %d jobs loaded", len(self.nodes), len(self.jobs))

    async def update_nodes(
        self, found: Mapping[str, str], *, by_name: Collection[str] = ()
    ) -> None:
        """Take in node gateways found at run time (``{node: url}``, e.g. by discovery).

        A new node joins placement (healthy: it just answered); a known node at another URL
        is reached there from now on (its old connection pool is closed a call later). Nodes
        missing from ``found`` stay: the health probes decide about them. The nodes in
        ``by_name`` (those discovery found) have their certificate verified against their
        own name, not their URL's host (:mod:`core.server_names`).
        """
        retired, self._retired = self._retired, []
        for node, url in sorted(found.items()):
            url = url.rstrip("/")
            tls_name = node if node in by_name else None
            h = self.nodes.get(node)
            if h is not None and h.url == url and h.tls_name == tls_name:
                continue
            if h is None:
                log.info("node %s found at %s: in placement", node, url)
                self.nodes[node] = NodeHealth(node, url, self._mc_of(node), tls_name=tls_name)
            else:
                log.info("node %s moved from %s to %s", node, h.url, url)
                h.url, h.tls_name = url, tls_name
                self._retired.append(self.clients[node])
            self.clients[node] = self._gateway_client(node, url, tls_name)
        self.nodes = dict(sorted(self.nodes.items()))
        for c in retired:  # after the tables changed: nothing waits on these closes
            await c.aclose()

    async def stop(self) -> None:
        """Close connections."""
        clients: list[GatewayClient] = [*self.clients.values(), *self._retired]
        for c in clients:
            await c.aclose()
        if self.provider is not None:
            await self.provider.aclose()
        if self.scheduler is not None:
            await self.scheduler.aclose()
        await self.store.aclose()

    # ------------------------------------------------------------------ jobs
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
        masked = secagg.declared(initial_weights, spec) if initial_weights else None
        async with self.job_lock(spec.name):
            if spec.name in self.jobs:
                raise JobExists(spec.name)
            await self._settle_deletion(spec.name)
            nodes = self.healthy_nodes()
            if not nodes:
                raise NoHealthyNodes()
            job = JobState(spec, rule="" if rule is None else rule.rule)
            if masked is not None:
                job.secagg = masked.to_spec()
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
                if n == job.root and outcome == "not_root":
                    # the gateway at the root's address says another node is the root: it is
                    # not that node (an address two nodes share); the job is on no gateway
                    raise GatewayError(
                        n,
                        f"the gateway at {self.nodes[n].url} refused to create job "
                        f"{spec.name!r} as its root node {n}: {answer.get('detail', answer)}",
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

    async def _settle_deletion(self, name: str) -> None:
        """Before ``name`` is created again: tell the gateways still owed the deletion of its
        old incarnation; refuse (:class:`JobBeingDeleted`) while its root, which holds the
        old journal, has not heard it (the new job would attach to the old one there). A
        non-root node that has not heard it drops the old incarnation once the journal names
        the new one. Call it holding the job's lock."""
        if name not in self.deletions:
            return
        await self._tell(name)
        rec = self.deletions.get(name)
        if rec is not None and rec["root"] in rec["nodes"]:
            raise JobBeingDeleted(name, rec["root"])
        self.forget_deletion(name)

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
        async with self.job_lock(name):
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

    async def delete_job(self, name: str) -> None:
        """Forget a job, and delete it on the gateways: a job created again under the same
        name is then a new one (new salt), which refuses the old clients' tokens. A gateway
        that cannot be reached now is told once it answers again
        (:mod:`control_plane.deletions`)."""
        async with self.job_lock(name):
            job = self.job(name)
            self.jobs.pop(name)
            self.plans.pop(name, None)
            await self.store.delete(name)
            if job.secagg:  # its open round's stages (control_plane.secagg_stages)
                await self.store.delete_record(record_key(name))
            await self.delete_on_gateways(name, job.root)

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
        and model reads (told here, all at once; one that is down learns it from the shared
        journal), the assignment refuses it (403) and it is never selected again.

        The job's rounds still need ``goal`` updates: revoking a client that would leave fewer
        clients than that answers :class:`TooFewClients` (409) and changes nothing, unless
        ``force``; then the goal of the rounds drops to the clients left. If the client was
        selected for the open round and the round's other selected clients cannot reach its
        goal, the open round's goal drops to them.
        """
        async with self.job_lock(name):
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
            told = []
            answers = await self.on_nodes(
                self.healthy_nodes(), lambda c: c.revoke_client(name, client)
            )
            for n, ans in answers.items():
                if isinstance(ans, ControlPlaneError):
                    log.warning(
                        "job %s: %s not told of %s's revocation: %s", name, n, client, ans.detail
                    )
                elif ans:
                    told.append(n)
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

    # ------------------------------------------------------------------ periodic work
    async def tick(self) -> None:
        """One control period: health probes, autoscaling, progress polls, round closing,
        deletions owed to gateways that answer again."""
        await self.check_health()
        await self.autoscale(self._reports)
        await self.poll()
        await self.retry_deletions()

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
            "revoked": list(job.revoked),  # never selected again; their tokens refused
            # round 1 waits for enough clients to enroll
            "waiting_for_clients": rnd is None and not job.done and not job.failed,
            "round": None if rnd is None else round_view(rnd),
            "history": job.history,  # the newest jobs.HISTORY_ROUNDS rounds
            "totals": job.totals,  # over every ended round
            # acknowledged updates in no published model, the open round's included: a dead
            # node's, and those the gateways report dropped (``JobState.count_dropped``)
            "lost": job.lost(),
            # gateways not told of the job's deletion yet (a failed job's live state)
            "deleting_on": list(self.deletions.get(name, {}).get("nodes", [])),
        }
