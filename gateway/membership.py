"""Which jobs this node runs: jobs loaded from the journal and forgotten, a job's root that moves,
its rounds advanced by the root's publications, its model fetched from the root, a client
revoked, a job deleted."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

import httpx

from core import wire
from gateway import forward, recovery
from gateway.creation import install, make_job
from gateway.errors import GatewayError
from gateway.jobs import Job
from gateway.plan import CLIENT_ID
from gateway.round_io import open_round

if TYPE_CHECKING:
    from gateway.node import Node

log = logging.getLogger(__name__)


async def load_jobs(gw: Node) -> None:
    """Pick up jobs created on other nodes that include this node, their versions and
    their revoked clients (run at start and every ~0.2 s by the housekeeping loop).

    A job here whose name the journal now gives to another job (deleted on its root and
    created again: a new id and salt) is forgotten here and the new one loaded; a job here
    that the journal no longer has (deleted on its root, also while this node could not
    be reached) is forgotten here, its objects freed.
    """
    had = dict(gw.jobs)  # before the read: a job created since is not taken for deleted
    journaled = await gw.journal.jobs()
    for name, job in had.items():
        if name not in journaled and gw.jobs.get(name) is job and name not in gw.creating:
            log.warning("job %s was deleted (the journal has it no more); forgotten", name)
            _forget(gw, job)
    for name, meta in journaled.items():
        if name in gw.creating:
            continue
        incarnation = (name, int(meta["id"]))
        if name in gw.jobs:
            job = gw.jobs[name]
            if job.id == incarnation[1]:
                if meta["nodes"] != job.nodes:
                    me = gw.settings.node
                    if job.root == me != meta["nodes"][0]:  # another node took it over
                        log.error(
                            "job %s: node %s took it over from this node; loading it again "
                            "as one of its nodes",
                            name,
                            meta["nodes"][0],
                        )
                        forget_and_reload(gw, job)
                        continue
                    move_root(gw, job, list(meta["nodes"]))
                job.since = int(meta.get("since", 0))  # a takeover moves it
                if job.root != gw.settings.node:
                    v = await gw.journal.version(name)
                    if v > job.version:
                        advance_remote(gw, job, v)
                continue
            log.info("job %s was created again (id %d -> %d)", name, job.id, incarnation[1])
            _forget(gw, job)
        if gw.settings.node not in meta["nodes"] or incarnation in gw.skip:
            continue
        job = make_job(gw, meta, wire.ModelSpec.from_json(meta["spec"]))
        job.version = await gw.journal.version(name)
        if meta["nodes"][0] == gw.settings.node and not await recovery.recover_model(gw, job):
            job.ns.close()
            gw.skip.add(incarnation)
            continue
        install(gw, job)
        await recovery.recover_round(gw, job)
        if job.root != gw.settings.node:
            prefetch(gw, job)
    if gw.jobs:
        for name, revoked in (await gw.journal.revoked(list(gw.jobs))).items():
            if name in gw.jobs:
                gw.jobs[name].revoked |= revoked


def advance_remote(gw: Node, job: Job, version: int) -> None:
    """A job whose root is another node published ``version``: open the next round here,
    and fetch the new model at once (this node's clients download it next, and it is what
    this node adopts the job from should the root die: :mod:`gateway.takeover`).

    Updates of the round that ends here which no partial carried on (a slot that had not
    finished: the root published without them) are counted as dropped
    (:func:`gateway.forward.drop_unfinished`)."""
    if job.engine is not None:
        forward.drop_unfinished(
            gw,
            job,
            job.engine,
            f"round {job.engine.round} ended (root {job.root} published version {version}) "
            "before the slot finished here",
        )
        job.engine.close()
    job.version = version
    job.model_bytes = b""
    open_round(gw, job)
    prefetch(gw, job)


def prefetch(gw: Node, job: Job) -> None:
    """Fetch ``job``'s current model from its root in the background (a non-root node)."""
    if gw.loop is not None and not gw.stopping:
        gw.background.spawn(
            _prefetch_model(gw, job, job.version), f"prefetch:{job.name}/{job.version}"
        )


#: tries of one background fetch of a new model, and the longest wait between two
PREFETCH_TRIES, PREFETCH_MAX_WAIT = 10, 2.0


async def _prefetch_model(gw: Node, job: Job, version: int) -> None:
    """Fetch model ``version`` until this node holds its bytes: also while the root still
    serves the version before (it journals a new version before it serves it)."""
    for attempt in range(PREFETCH_TRIES):
        if job.version != version or job.model_bytes or gw.jobs.get(job.name) is not job:
            return
        try:
            if await fetch_root_model_once(gw, job):
                return
            log.info(
                "job %s: root %s does not serve model v%d yet; fetching it again",
                job.name,
                job.root,
                version,
            )
        except (GatewayError, httpx.HTTPError, KeyError, ValueError) as exc:
            log.debug("job %s: prefetch of model v%d failed: %s", job.name, version, exc)
        await asyncio.sleep(min(0.2 * 2**attempt, PREFETCH_MAX_WAIT))


async def follow_root(gw: Node, job: Job) -> None:
    """Take ``job``'s node order from the journal now: a plan with the top on a new root
    may arrive before the housekeeping loop reads it (a root this node was is left to
    that loop, which loads the job again)."""
    meta = await gw.journal.job(job.name)
    if (
        meta is not None
        and int(meta["id"]) == job.id
        and meta["nodes"] != job.nodes
        and job.root != gw.settings.node
    ):
        move_root(gw, job, list(meta["nodes"]))


def move_root(gw: Node, job: Job, nodes: list[str]) -> None:
    """The journal gives ``job`` a new node order (another node took it over, see
    :mod:`gateway.takeover`): its root is ``nodes[0]`` from now on. The open round keeps
    its plan until the control plane pushes one with the top on the new root; later
    rounds' own plan follows the new order."""
    log.warning("job %s: root node %s -> %s", job.name, job.root, nodes[0])
    job.nodes = list(nodes)
    job.base_plan = gw.planner(job.goal, job.clients, job.nodes)


async def delete_job(gw: Node, name: str) -> None:
    """Forget a job on this node: its objects, endpoint and (on its root) its journal."""
    job = gw.job(name)
    _forget(gw, job)
    if job.root == gw.settings.node:
        await gw.journal.delete_job(name)
    log.info("job %s deleted on node %s", name, gw.settings.node)


def forget_and_reload(gw: Node, job: Job) -> None:
    """Forget ``job`` here and load it again from the journal at the next read (another
    node took it over from this one: it comes back as one of its nodes)."""
    _forget(gw, job)
    gw.skip.discard((job.name, job.id))


def _forget(gw: Node, job: Job) -> None:
    """Drop ``job`` from this node (its round, endpoint, store objects); never reload it."""
    del gw.jobs[job.name]
    gw.skip.add((job.name, job.id))
    if job.engine is not None:
        job.engine.close()
    if job.endpoint is not None:
        job.endpoint.close()
    if gw.handoff is not None:
        gw.handoff.withdraw(job.ns)
    job.ns.close()


async def revoke_client(gw: Node, job: Job, client: str, *, force: bool) -> dict[str, Any]:
    """``DELETE /v1/jobs/{job}/clients/{client}``: revoke one client of ``job``.

    Recorded in the journal and here: this node refuses the client's uploads and model
    reads at once, the job's other nodes from their next journal read (the housekeeping
    loop, every ~0.2 s). An update accepted (202) before that still counts.

    The round still needs its goal of updates from the clients left. Where the plan
    needs more updates on a node than clients are left to send them there, the round
    could only end by being closed (``POST .../close``; the control plane does it at
    the round's deadline): that answers 409 ``too_few_clients`` and revokes nothing,
    unless ``force`` (the answer then names those nodes in ``short_nodes``). Revoking a
    revoked client again answers the same 200 (idempotent); an unknown one 404.
    """
    if client not in job.client_set and not (job.enrolled and CLIENT_ID.match(client)):
        raise GatewayError(
            f"{client!r} is not a client of job {job.name!r}", status=404, code="unknown_client"
        )
    short = job.short_nodes(job.revoked | {client})
    if short and not force and client not in job.revoked:
        raise GatewayError(
            f"revoking {client!r} leaves fewer clients than the round's goal on "
            + ", ".join(
                f"node {n} ({have} for a goal of {goal})" for n, (have, goal) in short.items()
            )
            + "; the round could then end only when closed. Add ?force=true to revoke anyway",
            status=409,
            code="too_few_clients",
        )
    await gw.journal.revoke(job.name, client)
    job.revoked.add(client)
    log.warning("job %s: client %s revoked", job.name, client)
    return {
        "job": job.name,
        "client": client,
        "revoked": sorted(job.revoked),
        "short_nodes": {n: {"clients": h, "goal": g} for n, (h, g) in short.items()},
    }


async def fetch_root_model(gw: Node, job: Job) -> None:
    """Non-root nodes serve the model they fetch from the root node's gateway (see
    :func:`fetch_root_model_once`)."""
    await fetch_root_model_once(gw, job)


async def fetch_root_model_once(gw: Node, job: Job) -> bool:
    """Fetch ``job``'s model from its root once. True when this node now holds the bytes of
    ``job.version``; False when the root answered an older version (it journals a new
    version before it serves it) or ``job`` advanced meanwhile: nothing is kept then."""
    url = gw.peer_url(job.root)
    if url is None:
        raise GatewayError(
            f"model lives on node {job.root}; no peer URL configured or discovered",
            status=503,
            code="no_peer",
        )
    r = await gw.peers.get(
        f"{url}/v1/jobs/{job.name}/model", headers={"Authorization": f"Bearer {gw.secret}"}
    )
    r.raise_for_status()
    version = int(r.headers["x-model-version"])
    if version > job.version:
        # Open the next round too: setting only the version would leave this node on the
        # old round for good (the housekeeping loop advances only when the version grows).
        advance_remote(gw, job, version)
    if version >= job.version and r.content:
        job.model_bytes = r.content
    return version == job.version and bool(job.model_bytes)
