"""A job comes to this node: created from its initial weights or last checkpoint, or made from
its journal record (:mod:`gateway.membership` loads those), and installed here."""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from core import wire
from core.fedbuff import AsyncSpec
from core.objstore import Namespace, StoreFull
from core.robust import METADATA_KEY as AGGREGATION_KEY
from core.robust import RobustRule
from core.server_opt import (
    ServerOptError,
    ServerOptimizer,
    state_from_safetensors,
    state_to_safetensors,
)
from gateway import auth, fedbuff, server_opt
from gateway.bodies import RETRY_AFTER_S
from gateway.errors import GatewayError, JobExists, StoreUnavailable
from gateway.flstore import notify_engine
from gateway.jobs import Job, check_job_params
from gateway.meta import declared_evaluator, declared_spec
from gateway.publish import global_record
from gateway.round_io import open_round, receive
from gateway.secagg import MaskedJob, declared_secagg, masked_job, served_spec

if TYPE_CHECKING:
    from gateway.node import Node

log = logging.getLogger(__name__)
T = TypeVar("T")


async def create_job(
    gw: Node,
    name: str,
    rounds: int,
    goal: int,
    clients: Sequence[str],
    nodes: Sequence[str] | None,
    body: bytes | memoryview,
    resume: bool = False,
) -> Job:
    """Create a job from its initial weights, or (``resume``) from its last checkpoint.

    Resuming reads the newest global model of job ``name`` from MinIO and opens the round
    after it: a job outlives the loss of every gateway, its store and its Redis journal.
    ``body`` may be a view of shared memory that the caller frees afterwards: the job keeps
    a copy (the model it serves), nothing else refers to it.
    """
    nodes = check_job_params(name, rounds, goal, clients, nodes, gw.settings.node)
    start = 0
    opt_ckpt: bytes | None = None
    if resume:
        if body:
            raise GatewayError(
                "resume=true takes the model from the last checkpoint: send no body",
                code="body_with_resume",
            )
        start, body = await _last_checkpoint(gw, name)
        opt_ckpt = await server_opt_checkpoint(gw, name, start)
        if start >= rounds:
            raise GatewayError(
                f"job {name!r} already finished round {start} of {rounds}; ask for more rounds",
                code="bad_job",
            )
    try:
        spec = wire.ModelSpec.from_safetensors(body, gw.settings.max_header)
    except wire.WireError as exc:
        raise GatewayError(exc.detail, code=exc.code) from None
    evaluator = declared_evaluator(body, gw.settings.max_header)
    if opt_ckpt is not None:  # a resumed job: its optimizer is the checkpoint's
        try:
            opt: ServerOptimizer | None = state_from_safetensors(opt_ckpt)[0]
        except ServerOptError as exc:
            raise GatewayError(str(exc), status=409, code="bad_server_opt_state") from None
    else:
        opt = server_opt.declared(body, gw.settings.max_header)
    mode = fedbuff.declared(body, gw.settings.max_header)
    if mode is not None and opt is not None:
        raise GatewayError(
            "an async job applies its buffers with FedBuff's server learning rate (eta in "
            "its async spec); a server optimizer with it is not supported: leave one out",
            code="bad_async",
        )
    rule = declared_spec(
        body, gw.settings.max_header, AGGREGATION_KEY, RobustRule.from_json, "bad_aggregation"
    )
    secagg_cfg = declared_secagg(
        body,
        gw.settings.max_header,
        spec,
        goal,
        {"aggregation": rule, "fedbuff": mode, "server_opt": opt, "evaluator": evaluator},
    )
    if rule is not None and mode is not None:
        raise GatewayError(
            f"{rule.rule} needs a round's updates at once; an async job applies buffers "
            "as they fill: leave one out",
            code="bad_aggregation",
        )
    if rule is not None and len(nodes) > 1:
        raise GatewayError(
            f"{rule.rule} needs every update of a round on the node that reduces them: "
            f"create the job on one node, not {len(nodes)} ({', '.join(nodes)})",
            code="bad_aggregation",
        )
    if name in gw.jobs or await gw.journal.job(name) is not None:
        raise JobExists(f"job {name!r} exists; pick another name")
    meta = {
        "name": name,
        "id": await gw.journal.new_job_id(),
        "rounds": rounds,
        "goal": goal,
        "clients": list(clients),
        "nodes": nodes,
        "spec": spec.to_json(),
        "salt": auth.new_salt(),  # a new incarnation: the tokens of an older one fail
    }
    if evaluator is not None:
        meta["evaluator"] = evaluator
    if opt is not None:
        meta["server_opt"] = opt.to_json()
    if rule is not None:
        meta["aggregation"] = rule.to_json()
    masked = masked_job(body, gw.settings.max_header, secagg_cfg)
    if masked is not None:
        meta["secagg"] = masked.to_json()
    if mode is not None:
        meta["async"] = mode.to_json()
        meta["since"] = start  # the models before a resumed job's checkpoint are not kept
    job: Job | None = None
    try:
        job = make_job(gw, meta, spec)
        g = job.ns.allocate()
    except (StoreFull, OSError) as exc:  # /dev/shm full: the job is on no node yet
        if job is not None:
            job.ns.close()
        log.warning("job %s not created: no store object for its model: %s", name, exc)
        raise StoreUnavailable(
            f"job {name!r} not created: this node's object store has no room for its "
            f"model now ({exc})",
            retry_after=RETRY_AFTER_S,
        ) from None
    try:
        wire.decode_into(body, spec, g.buf, gw.settings.max_header, check_finite=True)
        wire.write_header(g.buf, spec, kind=wire.KIND_GLOBAL, weight=0, count=0, round=start)
        g.close()
        job.ns.seal(g.key)
        if opt_ckpt is not None:
            state = server_opt.from_checkpoint(opt_ckpt, job, start)
            job.opt_keys = server_opt.write_state(job, state, start)
    except wire.WireError as exc:
        job.ns.close()
        raise GatewayError(exc.detail, code=exc.code) from None
    except GatewayError:
        job.ns.close()
        raise
    # the housekeeping loop must not load the job from the journal meanwhile: it would
    # take it for one of this node's from before a restart, find no model, and close the
    # namespace this job is being created in
    gw.creating.add(name)
    try:
        if not await gw.journal.create_job(name, meta):
            job.ns.close()
            raise JobExists(f"job {name!r} exists; pick another name")
        job.global_key, job.model_bytes, job.version = (
            g.key_bytes,
            served_model(job, body, g.key_bytes, start),
            start,
        )
        await gw.journal.publish(
            name,
            start,
            global_record(g.key_bytes, 0, 0, job.opt_keys),
            root=gw.settings.node,
        )
    except BaseException:
        gw.creating.discard(name)
        raise
    if gw.checkpoints is not None and start == 0:
        # round 0 is the initial model: FLStore's workloads on round 1 need it (w - g0),
        # and a job that has not finished a round resumes from it
        gw.checkpoints.put_global(name, 0, job.model_bytes, {"version": 0, "count": 0})
        if opt is not None:  # a job resumed before its first round finds its optimizer
            gw.checkpoints.put_server_opt(name, 0, state_to_safetensors(opt, {}, 0))
        round0: dict[str, Any] = {
            "job": name,
            "round": 0,
            "version": 0,
            "count": 0,
            "clients": {},
        }
        if evaluator is not None:
            round0["round_meta"] = {"evaluator": evaluator}
        key = gw.checkpoints.put_meta(name, 0, round0)
        notify_engine(gw, name, 0, key)
    install(gw, job)
    gw.creating.discard(name)
    return job


async def _last_checkpoint(gw: Node, name: str) -> tuple[int, bytes]:
    if gw.checkpoints is None:
        raise GatewayError(
            "resuming needs checkpoints: start the gateway with --minio",
            status=409,
            code="no_checkpoints",
        )
    found = await newest_checkpoint(gw, name)
    if found is None:
        raise GatewayError(
            f"no checkpoint of job {name!r} in MinIO bucket {gw.settings.minio_bucket!r}",
            status=404,
            code="no_checkpoint",
        )
    rnd, data = found
    log.info("job %s: resuming from the checkpoint of round %d", name, rnd)
    return int(rnd), bytes(data)


async def server_opt_checkpoint(gw: Node, name: str, rnd: int) -> bytes | None:
    """The server optimizer state checkpointed after round ``rnd`` (None: the job has no
    optimizer); 503 ``checkpoints_unavailable`` when MinIO cannot be read."""
    assert gw.checkpoints is not None
    return await _read_minio(gw.checkpoints.server_opt, name, rnd)


async def newest_checkpoint(gw: Node, name: str) -> tuple[int, bytes] | None:
    """``(round, safetensors)`` of job ``name``'s newest global model in MinIO (or queued
    for it), None when it has none; 503 ``checkpoints_unavailable`` when MinIO cannot be
    read. Needs ``--minio``."""
    assert gw.checkpoints is not None
    return await _read_minio(gw.checkpoints.latest, name)


def served_model(
    job: Job, body: bytes | memoryview, key: bytes, version: int
) -> bytes | memoryview:
    """The initial model (object ``key``) as the job serves it: its weights as sent, in one of
    the job's model buffers (:meth:`Job.initial_model_view`), or for a masked job the float32
    words the SDK laid into its masked vector (:func:`gateway.secagg.served_spec`)."""
    if job.secagg is None:
        return job.initial_model_view(body)
    with job.ns.open(key) as obj:
        return wire.encode(obj.buf, served_spec(job.spec), job.model_metadata(version))


def make_job(gw: Node, meta: dict[str, Any], spec: wire.ModelSpec) -> Job:
    """The job that journal record ``meta`` describes, as this node runs it: its plan, its
    store namespace (sized for the objects this node holds at once), its client tokens."""
    s = gw.settings
    plan = gw.planner(int(meta["goal"]), meta["clients"], meta["nodes"])
    slots = sum(1 for x in plan.slots if x.node == s.node)
    # a robust rule holds the round's updates until it has them all; eager FedAvg frees
    # each once its leaf's partial is journaled
    held = (
        min(plan.node_goal(s.node), s.max_inflight + 2 * s.fanout)
        if s.max_inflight and not meta.get("aggregation")
        else plan.node_goal(s.node)
    )
    cap = max(1, s.pool_max_bytes // spec.object_nbytes)
    opt = ServerOptimizer.from_json(meta["server_opt"]) if meta.get("server_opt") else None
    mode = AsyncSpec.from_json(meta["async"]) if meta.get("async") else None
    # at publication a server optimizer writes the next model and its next state; an
    # async job's root keeps the models its updates may have trained on and writes the next
    extra = 0 if opt is None else 1 + len(opt.state_names)
    if mode is not None:
        extra += 1 + mode.max_staleness
    pool_max = min(held + slots + 2 + extra, cap)
    # pre-fault only what the first uploads need; the pool then grows to the real peak
    pool = s.pool if s.pool is not None else min(pool_max, (s.max_inflight or 4) + 2)
    ns = Namespace(
        s.shm_root, s.node, meta["name"], spec.object_nbytes, pool=pool, pool_max=pool_max
    )
    salt = str(meta.get("salt", ""))
    secret, name = gw.secret, meta["name"]

    def mint(client: str) -> str:
        return auth.client_token(secret, name, salt, client)

    job = Job(
        meta["name"],
        int(meta["id"]),
        spec,
        int(meta["rounds"]),
        int(meta["goal"]),
        list(meta["clients"]),
        list(meta["nodes"]),
        plan,
        ns,
        s.node,
        salt=salt,
        server_opt=opt,
        fedbuff=mode,
        rule=RobustRule.from_json(meta["aggregation"]) if meta.get("aggregation") else None,
        since=int(meta.get("since", 0)),
        secagg=MaskedJob.from_json(meta["secagg"]) if meta.get("secagg") else None,
        mint=mint,
        tokens={c: mint(c) for c in meta["clients"]},
        times=collections.deque(maxlen=s.round_times_kept),
    )
    job.managed = job.enrolled  # its rounds' clients come with the control plane's plans
    return job


def install(gw: Node, job: Job) -> None:
    """Run ``job`` here: its endpoint and receive thread, and its next round open."""
    gw.jobs[job.name] = job
    if job.root == gw.settings.node:  # the root publishes the job's models
        threading.Thread(
            target=job.reserve_model_buffers, name=f"gw-buffers-{job.name}", daemon=True
        ).start()
    job.endpoint = gw.router.local_endpoint(job.id)
    th = threading.Thread(target=receive, args=(gw, job), name=f"gw-rx-{job.name}", daemon=True)
    th.start()
    # a forgotten job's thread ends with its endpoint: only the live ones are kept
    gw.rx_threads = [t for t in gw.rx_threads if t.is_alive()] + [th]
    open_round(gw, job)
    log.info(
        "job %s (id %d): %d rounds, goal %d, %d clients, nodes %s, %d-byte objects",
        job.name,
        job.id,
        job.rounds,
        job.goal,
        len(job.clients),
        job.nodes,
        job.spec.object_nbytes,
    )


async def _read_minio(read: Callable[..., T], *args: Any) -> T:
    """``read(*args)`` (a checkpoint read) off the event loop; 503 ``checkpoints_unavailable``
    when MinIO cannot be read."""
    from core.checkpoints import CheckpointError

    try:
        return await asyncio.to_thread(read, *args)
    except CheckpointError as exc:
        raise GatewayError(
            f"MinIO cannot be read now ({exc}); try again when it is back",
            status=503,
            code="checkpoints_unavailable",
        ) from None
