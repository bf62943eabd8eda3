"""The coordinator's state and the helpers every part of it shares.

:class:`CoordinatorBase` holds the node and job tables, the gateway clients, the state store
and the per-job locks; the parts of :class:`~control_plane.coordinator.Coordinator` build on
it (:mod:`~control_plane.deletions`, :mod:`~control_plane.opening`,
:mod:`~control_plane.closing`, :mod:`~control_plane.failover`, :mod:`~control_plane.scaling`).

Locking: one :class:`asyncio.Lock` per job name (:meth:`CoordinatorBase.job_lock`) orders the
steps of that job (a round opening, closing, a node's evacuation, a deletion). No lock is
shared by all jobs: a gateway that hangs holds up the job it is asked about, never the
others, node discovery or the health probes. Code that reads state, calls out and applies
the answer takes the job's lock around the whole step, or checks (:meth:`still_current`)
that the job and its round are those it read before it applies anything.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import ssl
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, TypeVar

import numpy as np

from control_plane.errors import ControlPlaneError, GatewayError, UnknownJob
from control_plane.gateways import GatewayClient
from control_plane.jobs import JobSpec, JobState, NodeHealth, RoundInfo, job_to_json
from control_plane.placement import place
from control_plane.planning import Plan, QueueEstimator, plan_hierarchy
from control_plane.selection import OortScheduler
from control_plane.store import MemoryStore, StateStore
from core.openfaas import AsyncOpenFaaS

log = logging.getLogger(__name__)

T = TypeVar("T")


class CoordinatorBase:
    """State of the coordinator and the helpers its parts share (see the module)."""

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
        gateway_timeout: float = 5.0,
        close_retries: int = 6,
        clock: Callable[[], float] = time.time,
        gateway_tls: ssl.SSLContext | None = None,
    ) -> None:
        self._mc = mc
        #: with TLS: gateways verified against the platform's CA, this service's certificate sent
        self.gateway_tls = gateway_tls
        self.gateway_timeout = gateway_timeout
        self.nodes = {n: NodeHealth(n, u, self._mc_of(n)) for n, u in sorted(gateways.items())}
        self.admin_token = admin_token
        self.clients = {n: self._gateway_client(n, h.url) for n, h in self.nodes.items()}
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
        self.job_ready_timeout = job_ready_timeout
        self.push_plans = push_plans
        self.scheduler = scheduler
        #: failed attempts at closing a round on its gateways after its deadline before the
        #: job fails (a gateway that answers again meanwhile lets the round close)
        self.close_retries = close_retries
        self.clock = clock
        self.jobs: dict[str, JobState] = {}
        self.plans: dict[str, Plan] = {}
        self.last_scale: int | None = None
        self.scale_error: str | None = None
        #: autoscale decisions the provider refused or did not answer (after its retries)
        self.scale_failures = 0
        self.scale_down_after = scale_down_after
        self._busy_at = clock()
        self._reports: dict[str, dict[str, Any]] = {}
        self._job_locks: dict[str, asyncio.Lock] = {}
        #: nodes whose address answers as another node (:meth:`NodeFailover._own_answer`)
        self._impostors: set[str] = set()
        #: job -> {"root": its root node, "nodes": the nodes not told of its deletion yet}
        #: (:mod:`control_plane.deletions`)
        self.deletions: dict[str, dict[str, Any]] = {}

    def _gateway_client(self, node: str, url: str, tls_name: str | None = None) -> GatewayClient:
        verify = self.gateway_tls if self.gateway_tls is not None else True
        return GatewayClient(
            node,
            url,
            admin_token=self.admin_token,
            timeout=self.gateway_timeout,
            verify=verify,
            tls_name=tls_name,
        )

    def _mc_of(self, node: str) -> float:
        mc = self._mc
        return float(mc if isinstance(mc, int | float) else mc.get(node, 20.0))

    # ------------------------------------------------------------------ locks
    def job_lock(self, name: str) -> asyncio.Lock:
        """The lock that orders the steps of job ``name`` (made on first use)."""
        lock = self._job_locks.get(name)
        if lock is None:
            lock = self._job_locks[name] = asyncio.Lock()
        return lock

    def still_current(self, job: JobState, rnd: RoundInfo | None = None) -> bool:
        """True while ``job`` is the coordinator's job of its name and (given) ``rnd`` its
        current round, not ended: the check before a step applies what it read earlier."""
        if self.jobs.get(job.spec.name) is not job:
            return False
        if rnd is None:
            return True
        return job.current is rnd and rnd.state in ("open", "aggregating")

    # ------------------------------------------------------------------ nodes
    def healthy_nodes(self) -> list[str]:
        """Names of nodes in placement, sorted."""
        return [n for n, h in self.nodes.items() if h.healthy]

    def answering_nodes(self) -> list[str]:
        """Nodes whose last health probe answered (a node may answer again before it is
        back in placement), sorted."""
        return [n for n, h in self.nodes.items() if h.failures == 0]

    def job(self, name: str) -> JobState:
        """The job or :class:`UnknownJob`."""
        try:
            return self.jobs[name]
        except KeyError:
            raise UnknownJob(name) from None

    def _job_nodes(self, job: JobState) -> list[str]:
        """Healthy nodes the job's rounds may use: all of them, or its root alone for a job
        whose rule needs every update on one node (``JobState.rule``)."""
        nodes = self.healthy_nodes()
        return [n for n in nodes if n == job.root] if job.rule else nodes

    async def on_nodes(
        self, nodes: Iterable[str], call: Callable[[GatewayClient], Awaitable[T]]
    ) -> dict[str, T | ControlPlaneError]:
        """``call`` on the gateway of each of ``nodes`` at once: node -> its answer, or the
        :class:`ControlPlaneError` it raised (one slow gateway does not hold up the others'
        calls; any other exception propagates)."""
        names = list(nodes)

        async def one(n: str) -> T | ControlPlaneError:
            try:
                return await call(self.clients[n])
            except ControlPlaneError as exc:
                return exc

        answers = await asyncio.gather(*(one(n) for n in names))
        return dict(zip(names, answers, strict=True))

    async def _wait_known(self, name: str, nodes: list[str]) -> None:
        """Wait until every gateway of the job's span knows it (others learn it from the root's
        journal a moment later), so no client is sent to a gateway that answers 404."""
        deadline = time.monotonic() + self.job_ready_timeout
        for n in nodes:
            while True:
                known, answer = await self.clients[n].job_known(name)
                if known:
                    break
                if time.monotonic() > deadline:
                    raise GatewayError(
                        n,
                        f"job {name!r} not known there {self.job_ready_timeout}s after creation "
                        f"(its last answer: {answer})",
                    )
                await asyncio.sleep(0.02)

    # ------------------------------------------------------------------ placement and plans
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

    async def _save(self, job: JobState) -> None:
        if self.jobs.get(job.spec.name) is job:  # a job deleted meanwhile stays deleted
            await self.store.save(job.spec.name, job_to_json(job))
