"""Node health and what a lost node means for the jobs on it.

A gateway failing ``health_failures`` consecutive ``/healthz`` probes for at least
``node_grace_s`` seconds is taken out of placement (a gateway process that restarts, as the
platform's supervisor or a kubelet restarts it, is back well within the grace and resumes its
rounds from its journal and shared memory). Each job with an open round is then evacuated on
its own, under its own lock, all at once (:meth:`NodeFailover._evacuate_job`): a gateway that
answers slowly holds up the job it is asked about, not the others nor the API.

If the surviving nodes of an open round hold updates, the round is closed on them: its goal
drops to what reached them, the updates the dead node had accepted are lost with its shared
memory (counted in ``lost``, logged), and the round completes with the exact FedAvg of the
survivors' updates. If they hold none yet (or the gateways cannot close rounds), the dead
node's clients are placed again on the others, the plan is re-planned (:func:`replan`) and
pushed, and the round goes on. The job's root node holds the global model and the top: when
it is the one lost, another node of the job first adopts the job
(:meth:`NodeFailover._take_over`, :mod:`gateway.takeover`), the clients whose updates died
with it are told to send them again (the round's ``resend``, in their assignment), its other
clients are placed again, and the round goes on with the top on the new root.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from control_plane.closing import CANNOT, DONE, RoundClosing
from control_plane.errors import ControlPlaneError, GatewayError
from control_plane.jobs import JobState, RoundInfo, delivered_per_leaf
from control_plane.planning import replan

log = logging.getLogger(__name__)


class NodeFailover(RoundClosing):
    """Probes the gateways and evacuates the jobs of a node that stopped answering."""

    async def check_health(self) -> dict[str, bool]:
        """Probe every gateway's /healthz; take failing ones out, bring recovered ones back."""
        clients = dict(self.clients)  # update_nodes may add or move nodes meanwhile
        results = [
            self._own_answer(n, body)
            for n, body in zip(
                clients, await asyncio.gather(*(c.healthz() for c in clients.values())), strict=True
            )
        ]
        self._reports = {n: r for n, r in zip(clients, results, strict=True) if r is not None}
        lost: list[str] = []
        for name, body in zip(clients, results, strict=True):
            h = self.nodes.get(name)
            if h is None or self.clients.get(name) is not clients[name]:
                continue  # the node moved while it was probed: its new address is probed next
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
                lost.append(name)
        for dead in lost:
            await self._evacuate(dead)
        return {n: h.healthy for n, h in self.nodes.items()}

    def _own_answer(self, node: str, body: dict[str, Any] | None) -> dict[str, Any] | None:
        """``node``'s health answer, or None when the gateway at its address says it is
        another node (two nodes configured at one address, a port taken by another node's
        gateway): that address does not reach ``node``, whose jobs must not go there."""
        said = None if body is None else body.get("node")
        if isinstance(said, str) and said != node:
            if node not in self._impostors:
                log.error(
                    "node %s: the gateway at %s answers as node %s; out of placement until "
                    "%s itself answers there",
                    node,
                    self.nodes[node].url if node in self.nodes else "?",
                    said,
                    node,
                )
            self._impostors.add(node)
            return None
        self._impostors.discard(node)
        return body

    async def _evacuate(self, dead: str) -> None:
        """Evacuate every job from ``dead``, each under its own lock, all at once."""
        await asyncio.gather(*(self._evacuate_job(job, dead) for job in list(self.jobs.values())))

    async def _evacuate_job(self, job: JobState, dead: str) -> None:
        async with self.job_lock(job.spec.name):
            if not self.still_current(job):
                return
            nodes = self.healthy_nodes()
            taken = False
            if job.root == dead and not job.failed and not job.done and nodes:
                taken = await self._take_over(job, dead, nodes)
                if job.failed:
                    return
            rnd = job.current
            if rnd is None or rnd.state not in ("open", "aggregating"):
                return
            lost = rnd.received.pop(dead, 0)
            if taken:
                lost = 0  # the clients whose updates the dead root held send them again
                await self._refresh_received(job, rnd, nodes)  # the leaves' counts, for replan
            elif rnd.placement == "coordinator" and nodes and rnd.closing is None:
                await self._refresh_received(job, rnd, nodes)
                if sum(rnd.received.values()) > 0 or rnd.close_pending is not None:
                    outcome = await self._shrink_round(job, rnd, f"node_lost:{dead}", nodes)
                    if outcome != CANNOT:  # closed, or closing (tried again by the polls)
                        rnd.lost += lost
                        self._log_lost(job, rnd, dead, lost, outcome == DONE)
                        await self._save(job)
                        return
            rnd.lost += lost
            if rnd.state == "aggregating" and sum(rnd.received.values()) < rnd.goal:
                rnd.state = "open"  # updates were lost with the node: take more
            if not nodes:
                await self._save(job)
                return
            await self._place_again(job, rnd, dead)
            await self._save(job)
            log.warning(
                "job %s round %d: node %s lost with %d accepted update(s); its clients moved "
                "off it",
                job.spec.name,
                rnd.number,
                dead,
                lost,
            )

    @staticmethod
    def _log_lost(job: JobState, rnd: RoundInfo, dead: str, lost: int, closed: bool) -> None:
        log.warning(
            "job %s round %d: node %s died holding %d accepted update(s) (as of the last "
            "poll); they are lost with its shared memory. The round's goal is lowered to the "
            "update(s) that reached %s%s",
            job.spec.name,
            rnd.number,
            dead,
            lost,
            ", ".join(sorted(rnd.closed_with or rnd.close_counts)),
            "" if closed else " (the close is still pending on a gateway)",
        )

    async def _place_again(self, job: JobState, rnd: RoundInfo, dead: str) -> None:
        """Place the dead node's clients on the healthy nodes, re-plan and push the plan."""
        nodes = self.healthy_nodes()
        moved = sorted(c for c, n in rnd.assignment.items() if n == dead)
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
        log.info(
            "job %s round %d: %d clients moved off %s", job.spec.name, rnd.number, len(moved), dead
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
        for n, st in (await self.on_nodes(nodes, lambda c: c.job_status(name))).items():
            if isinstance(st, ControlPlaneError):
                log.debug("takeover of %s: %s does not have it (%s)", name, n, st.detail)
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
        name = job.spec.name
        for n, st in (await self.on_nodes(nodes, lambda c: c.job_status(name))).items():
            if isinstance(st, ControlPlaneError):
                log.debug("refresh %s: %s", n, st.detail)
            elif st.round == rnd.number:
                rnd.received[n] = st.received
