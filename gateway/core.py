"""The node gateway: jobs, the embedded router, rounds, publishing, and the HTTP front door.

Peers (the other node gateways: a job's root receives its cross-node partials and serves its
model) are the static ``peers`` setting over those found behind ``peers_service``
(:mod:`fedfaas.discovery`, refreshed every ``discovery_interval`` seconds); see
:meth:`Gateway.peer_url`.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import httpx

import bpf
from fedfaas import wire
from fedfaas.auth import bearer, read_token_file
from fedfaas.discovery import Discovery
from fedfaas.fedbuff import AsyncSpec
from fedfaas.objstore import Namespace, StoreFull, check_root
from fedfaas.objstore.handoff import HandoffServer
from fedfaas.objstore.root import private_dir
from fedfaas.robust import METADATA_KEY as AGGREGATION_KEY
from fedfaas.robust import RobustRule
from fedfaas.server_opt import (
    ServerOptError,
    ServerOptimizer,
    state_from_safetensors,
    state_to_safetensors,
)
from gateway import auth, fedbuff, forward, recovery, server_opt
from gateway.asgi import AsgiExchange
from gateway.background import Background, JournalRetry
from gateway.bodies import RETRY_AFTER_S, MemoryBudget
from gateway.errors import GatewayError, JobExists, JobNotFound, StoreUnavailable
from gateway.http import Exchange, HttpServer, Request
from gateway.jobs import CLIENT_ID, Job, RoundTimes, check_job_params
from gateway.journal import Journal
from gateway.meta import declared_evaluator, declared_spec
from gateway.metrics import Metrics
from gateway.plan import Planner, Slot, static_plan
from gateway.publish import global_record, publish_round
from gateway.rounds import Input, RoundEngine
from gateway.settings import GatewaySettings
from gateway.sharded import ShardedRound

log = logging.getLogger(__name__)
T = TypeVar("T")
#: seconds a stop waits for the gateway's own tasks to end once cancelled and told to stop
STOP_TASKS_S = 5.0


def _load_planner(settings: GatewaySettings) -> Planner:
    if settings.planner:
        import importlib

        mod, _, fn = settings.planner.partition(":")
        loaded: Planner = getattr(importlib.import_module(mod), fn)
        return loaded
    return lambda g, c, n: static_plan(g, c, n, settings.fanout)


class Gateway:
    """One node gateway (see DESIGN.md, "Data path of one round")."""

    def __init__(self, settings: GatewaySettings, *, planner: Planner | None = None) -> None:
        self.settings = settings
        self.planner: Planner = planner or _load_planner(settings)
        self.jobs: dict[str, Job] = {}
        #: (name, id) of jobs deleted here or impossible to resume: not reloaded
        self._skip: set[tuple[str, int]] = set()
        self._creating: set[str] = set()  # jobs create_job is writing to the journal now
        #: bytes of request bodies held at once, all routes and jobs (``max_inflight_bytes``)
        self.budget = MemoryBudget(settings.max_inflight_bytes)
        self.metrics = Metrics(settings.node, self)
        self.secret = ""
        self.checkpoints: Any = None
        self.journal: Journal
        self.router: bpf.RouterServer
        self.http = HttpServer(self.route, settings.read_timeout)
        self.port = 0
        self.loop: asyncio.AbstractEventLoop | None = None
        self._stop = threading.Event()
        #: the tasks in flight (publications, forwards, journal records, ...): see
        #: :mod:`gateway.background`
        self.background = Background(self.metrics.task_failures)
        #: runs a journal operation until Redis takes it (``retry_max_s``)
        self.retry = JournalRetry(self.metrics.journal_retries, settings.retry_max_s, self._stop)
        self._threads: list[threading.Thread] = []
        self._app: Any = None
        #: the other node gateways (partials to a job's root, its model from there)
        self.peers = httpx.AsyncClient(timeout=120)
        #: peers found behind ``peers_service`` (this node left out), refreshed by a task
        self.discovered: dict[str, str] = {}
        self.discovery = Discovery(settings.peers_service) if settings.peers_service else None
        #: slots of open rounds waiting for an endpoint after the last assignment, per job
        self.shortage: dict[str, int] = {}
        self._pump_failing: set[str] = set()  # jobs whose last pump raised (logged once)
        self.engine_headers: dict[str, str] = {}
        #: lends published rounds' updates to this node's cache functions (``handoff_ttl_s``)
        self.handoff: HandoffServer | None = None
        self._made_dirs: list[Path] = []

    # -- lifecycle -----------------------------------------------------------------------------
    async def start(self) -> Gateway:
        from gateway.api import build_app

        s = self.settings
        check_root(s.shm_root)  # a squatted or loose store root is refused before anything
        self.loop = asyncio.get_running_loop()
        s.state_dir.mkdir(parents=True, exist_ok=True)
        self.secret = auth.load_or_create_secret(s.secret_path())
        # the cache engine's service token, read once: a missing file stops the gateway here
        tf = s.engine_token_file if s.engine_url else None
        self.engine_headers = bearer(read_token_file(tf, "engine token")) if tf else {}
        self.journal = Journal(s.redis_url, s.redis_credentials_file)
        await self.journal.ping()
        self.router = bpf.RouterServer(
            str(s.socket_path()),
            prefer_ebpf=s.prefer_ebpf,
            on_disconnect=self._disconnect_threadsafe,
        ).start()
        # Per-endpoint router metrics (kernel maps in eBPF mode), read at scrape time only.
        self.metrics.registry.register(bpf.prometheus_collector(self.router))
        self._app = build_app(self)
        self.checkpoints = self._checkpoint_writer()
        if s.engine_url and self.checkpoints is not None and s.handoff_ttl_s > 0:
            for d in (s.shm_root, s.shm_root / s.node):
                if not d.exists():
                    self._made_dirs.insert(0, d)  # removed on stop, if empty, deepest first
                private_dir(d)
            self.handoff = HandoffServer(s.handoff_path())
        # the jobs first, then the port: a restarted gateway that listened before it had
        # resumed its jobs answered their clients 401 (no such job here), which is final
        await self._load_jobs()
        recovery.sweep_deleted_jobs(self)
        self.port = await self.http.start(s.host, s.port)
        self.background.spawn(self._housekeeping(), "housekeeping")
        if self.discovery is not None:
            watch = self.discovery.watch(s.discovery_interval, self._found_peers, self._stop)
            self.background.spawn(watch, "peer-discovery")
        log.info(
            "gateway %s on %s:%d, router %s (%s)",
            s.node,
            s.host,
            self.port,
            self.router.mode,
            self.router.reason,
        )
        return self

    def _checkpoint_writer(self) -> Any:
        s = self.settings
        if not s.minio_endpoint:
            return None
        from fedfaas.checkpoints import CheckpointWriter
        from fedfaas.secretfiles import read_credentials

        creds = read_credentials(s.minio_credentials_file, "MinIO")
        return CheckpointWriter(
            s.minio_endpoint,
            creds.username,
            creds.password,
            s.minio_bucket,
            spool_dir=s.state_dir / f"checkpoint-spool-{s.node}",
        )

    @property
    def stopping(self) -> bool:
        """The gateway is stopping: background work ends (the journal keeps what it did)."""
        return self._stop.is_set()

    def offer_round(self, job: Job, rnd: int) -> dict[str, Any] | None:
        """Offer round ``rnd``'s updates kept for FLStore to this node's cache functions; the
        offer's ticket goes to the engine with the round's notice. Updates kept for earlier
        rounds (a round that never published here) are let go."""
        kept = job.handoff.pop(rnd, {})
        for r in [r for r in job.handoff if r < rnd]:
            self._drop_kept(job, job.handoff.pop(r))
        if self.handoff is None or not kept:
            return None
        s = self.settings
        ticket = self.handoff.offer(
            job.ns, job.name, rnd, job.spec.numel, job.spec.hash.hex(), kept, s.handoff_ttl_s
        )
        return {"socket": str(s.handoff_path()), "ticket": ticket, "node": s.node}

    @staticmethod
    def _drop_kept(job: Job, kept: dict[str, bytes]) -> None:
        for k in kept.values():
            if job.ns.leases(k):
                job.ns.release(k)

    def notify_engine(
        self, job: str, rnd: int, meta_key: str, handoff: dict[str, Any] | None = None
    ) -> None:
        """Tell the FLStore cache engine that round ``rnd`` is in MinIO, once it is.

        The engine ingests a round from the cold store, so this waits until the writer has
        sent the round's ``meta.json`` (queued last, so the round's other objects from this
        node went first; a MinIO outage delays the notice, never drops it), then retries the
        call with backoff until the engine answers. ``handoff`` (:meth:`_offer_round`) goes
        with it: where to claim the round's updates in this node's store.
        """
        url = self.settings.engine_url
        if not url or self.checkpoints is None:
            return
        target = f"{url.rstrip('/')}/v1/jobs/{job}/rounds/{rnd}/complete"
        headers = self.engine_headers
        body = {"handoff": handoff} if handoff else None

        async def run() -> None:
            while not self._stop.is_set():
                if await asyncio.to_thread(self.checkpoints.wait_sent, meta_key, 5.0):
                    break
            delay = 0.5
            while not self._stop.is_set():
                try:
                    r = await self.peers.post(target, headers=headers, json=body)
                    if r.status_code < 500:
                        if r.status_code >= 400:
                            log.warning("cache engine refused round %s/%d: %s", job, rnd, r.text)
                        else:
                            log.info("cache engine told: %s round %d complete", job, rnd)
                        return
                except httpx.HTTPError as exc:
                    log.debug("cache engine unreachable (%s); retrying", exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 30.0)

        self.background.spawn(run(), f"engine-notice:{job}/{rnd}")

    def checkpoint_client(self, job: Job, rnd: int, client: str, key: bytes) -> None:
        """Queue an accepted update for MinIO (encoded off the event loop; one extra lease);
        on the root with a handoff, keep it for FLStore too (one more lease, see
        :meth:`_offer_round`)."""
        if self.checkpoints is None or not self.settings.checkpoint_clients:
            return
        job.ns.retain(key)
        if self.handoff is not None and job.root == self.settings.node:
            job.ns.retain(key)
            job.handoff.setdefault(rnd, {})[client] = key

        async def run() -> None:
            try:

                def encode() -> None:
                    with job.ns.open(key) as obj:
                        data = wire.encode(obj.buf, job.spec)
                    self.checkpoints.put_client(job.name, rnd, client, data)

                await asyncio.to_thread(encode)
            except Exception:
                log.exception("job %s: checkpoint of %s's update failed", job.name, client)
            finally:
                job.ns.release(key)

        self.background.spawn(run(), f"checkpoint:{job.name}/{rnd}/{client}")

    async def stop(self) -> None:
        self._stop.set()
        # they end on the flag even where a cancel is lost (see _housekeeping)
        for t in await self.background.stop(STOP_TASKS_S):
            log.error("gateway task %s did not stop; left behind", t.get_name())
        try:
            await self.http.stop()
            for job in self.jobs.values():
                if job.endpoint is not None:
                    job.endpoint.close()
            for th in self._threads:
                th.join(2)
            self.router.stop()
            if self.checkpoints is not None:
                await asyncio.to_thread(self.checkpoints.close, 30.0)
        finally:
            if self.handoff is not None:  # claimers drop what they map before it goes
                self.handoff.close()
            # a stop is not a deletion: every job's store stays for the gateway's next start,
            # as after a crash (its model, the open round's acknowledged updates, partials and
            # checkpoints: what the journal names, gateway.recovery; the rest is swept then).
            # A store goes with its job (DELETE, seen at any later start too) or with the
            # deployment (``fedfaas down`` removes the platform's store root).
            for job in self.jobs.values():
                job.ns.detach()
            self.jobs.clear()
            for d in self._made_dirs:
                with contextlib.suppress(OSError):
                    d.rmdir()
            await self.peers.aclose()
            if self.discovery is not None:
                await self.discovery.aclose()
            await self.journal.close()
        log.info("gateway %s stopped", self.settings.node)

    def peer_url(self, node: str) -> str | None:
        """Base URL of another node's gateway: the ``peers`` setting, else the one discovered."""
        return self.settings.peers.get(node) or self.discovered.get(node)

    async def _found_peers(self, found: dict[str, str]) -> None:
        found.pop(self.settings.node, None)
        if found != self.discovered:
            log.info("peers discovered behind %s: %s", self.settings.peers_service, found)
        self.discovered = found

    def route(self, req: Request) -> Exchange:
        from gateway.ingest import PARTIAL, UPLOAD, PartialExchange, UploadExchange

        if req.method == "POST":
            m = UPLOAD.match(req.path)
            if m:
                return UploadExchange(self, req, m.group(1), int(m.group(2)))
            m = PARTIAL.match(req.path)
            if m:
                return PartialExchange(self, req, m.group(1), int(m.group(2)))
        return AsgiExchange(
            self._app,
            req,
            (self.settings.host, self.port),
            max_body=self.settings.max_json_body,
            budget=self.budget,
        )

    # -- jobs ----------------------------------------------------------------------------------
    async def create_job(
        self,
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
        nodes = check_job_params(name, rounds, goal, clients, nodes, self.settings.node)
        start = 0
        opt_ckpt: bytes | None = None
        if resume:
            if body:
                raise GatewayError(
                    "resume=true takes the model from the last checkpoint: send no body",
                    code="body_with_resume",
                )
            start, body = await self._last_checkpoint(name)
            opt_ckpt = await self.server_opt_checkpoint(name, start)
            if start >= rounds:
                raise GatewayError(
                    f"job {name!r} already finished round {start} of {rounds}; ask for more rounds",
                    code="bad_job",
                )
        try:
            spec = wire.ModelSpec.from_safetensors(body, self.settings.max_header)
        except wire.WireError as exc:
            raise GatewayError(exc.detail, code=exc.code) from None
        evaluator = declared_evaluator(body, self.settings.max_header)
        if opt_ckpt is not None:  # a resumed job: its optimizer is the checkpoint's
            try:
                opt: ServerOptimizer | None = state_from_safetensors(opt_ckpt)[0]
            except ServerOptError as exc:
                raise GatewayError(str(exc), status=409, code="bad_server_opt_state") from None
        else:
            opt = server_opt.declared(body, self.settings.max_header)
        mode = fedbuff.declared(body, self.settings.max_header)
        if mode is not None and opt is not None:
            raise GatewayError(
                "an async job applies its buffers with FedBuff's server learning rate (eta in "
                "its async spec); a server optimizer with it is not supported: leave one out",
                code="bad_async",
            )
        rule = declared_spec(
            body, self.settings.max_header, AGGREGATION_KEY, RobustRule.from_json, "bad_aggregation"
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
        if name in self.jobs or await self.journal.job(name) is not None:
            raise JobExists(f"job {name!r} exists; pick another name")
        meta = {
            "name": name,
            "id": await self.journal.new_job_id(),
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
        if mode is not None:
            meta["async"] = mode.to_json()
            meta["since"] = start  # the models before a resumed job's checkpoint are not kept
        job: Job | None = None
        try:
            job = self._make_job(meta, spec)
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
            wire.decode_into(body, spec, g.buf, self.settings.max_header, check_finite=True)
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
        self._creating.add(name)
        try:
            if not await self.journal.create_job(name, meta):
                job.ns.close()
                raise JobExists(f"job {name!r} exists; pick another name")
            job.global_key, job.model_bytes, job.version = g.key_bytes, bytes(body), start
            await self.journal.publish(
                name,
                start,
                global_record(g.key_bytes, 0, 0, job.opt_keys),
                root=self.settings.node,
            )
        except BaseException:
            self._creating.discard(name)
            raise
        if self.checkpoints is not None and start == 0:
            # round 0 is the initial model: FLStore's workloads on round 1 need it (w - g0),
            # and a job that has not finished a round resumes from it
            self.checkpoints.put_global(name, 0, job.model_bytes, {"version": 0, "count": 0})
            if opt is not None:  # a job resumed before its first round finds its optimizer
                self.checkpoints.put_server_opt(name, 0, state_to_safetensors(opt, {}, 0))
            round0: dict[str, Any] = {
                "job": name,
                "round": 0,
                "version": 0,
                "count": 0,
                "clients": {},
            }
            if evaluator is not None:
                round0["round_meta"] = {"evaluator": evaluator}
            key = self.checkpoints.put_meta(name, 0, round0)
            self.notify_engine(name, 0, key)
        self._install(job)
        self._creating.discard(name)
        return job

    async def _last_checkpoint(self, name: str) -> tuple[int, bytes]:
        if self.checkpoints is None:
            raise GatewayError(
                "resuming needs checkpoints: start the gateway with --minio",
                status=409,
                code="no_checkpoints",
            )
        found = await self.newest_checkpoint(name)
        if found is None:
            raise GatewayError(
                f"no checkpoint of job {name!r} in MinIO bucket {self.settings.minio_bucket!r}",
                status=404,
                code="no_checkpoint",
            )
        rnd, data = found
        log.info("job %s: resuming from the checkpoint of round %d", name, rnd)
        return int(rnd), bytes(data)

    async def server_opt_checkpoint(self, name: str, rnd: int) -> bytes | None:
        """The server optimizer state checkpointed after round ``rnd`` (None: the job has no
        optimizer); 503 ``checkpoints_unavailable`` when MinIO cannot be read."""
        assert self.checkpoints is not None
        return await _read_minio(self.checkpoints.server_opt, name, rnd)

    async def newest_checkpoint(self, name: str) -> tuple[int, bytes] | None:
        """``(round, safetensors)`` of job ``name``'s newest global model in MinIO (or queued
        for it), None when it has none; 503 ``checkpoints_unavailable`` when MinIO cannot be
        read. Needs ``--minio``."""
        assert self.checkpoints is not None
        return await _read_minio(self.checkpoints.latest, name)

    def _make_job(self, meta: dict[str, Any], spec: wire.ModelSpec) -> Job:
        s = self.settings
        plan = self.planner(int(meta["goal"]), meta["clients"], meta["nodes"])
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
        secret, name = self.secret, meta["name"]

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
            mint=mint,
            tokens={c: mint(c) for c in meta["clients"]},
            times=collections.deque(maxlen=s.round_times_kept),
        )
        job.managed = job.enrolled  # its rounds' clients come with the control plane's plans
        return job

    def _install(self, job: Job) -> None:
        self.jobs[job.name] = job
        if job.root == self.settings.node:  # the root publishes the job's models
            threading.Thread(
                target=job.reserve_model_buffers, name=f"gw-buffers-{job.name}", daemon=True
            ).start()
        job.endpoint = self.router.local_endpoint(job.id)
        th = threading.Thread(target=self._rx, args=(job,), name=f"gw-rx-{job.name}", daemon=True)
        th.start()
        # a forgotten job's thread ends with its endpoint: only the live ones are kept
        self._threads = [t for t in self._threads if t.is_alive()] + [th]
        self.open_round(job)
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

    async def _load_jobs(self) -> None:
        """Pick up jobs created on other nodes that include this node, their versions and
        their revoked clients (run at start and every ~0.2 s by the housekeeping loop).

        A job here whose name the journal now gives to another job (deleted on its root and
        created again: a new id and salt) is forgotten here and the new one loaded; a job here
        that the journal no longer has (deleted on its root, also while this node could not
        be reached) is forgotten here, its objects freed.
        """
        had = dict(self.jobs)  # before the read: a job created since is not taken for deleted
        journaled = await self.journal.jobs()
        for name, job in had.items():
            if name not in journaled and self.jobs.get(name) is job and name not in self._creating:
                log.warning("job %s was deleted (the journal has it no more); forgotten", name)
                self._forget(job)
        for name, meta in journaled.items():
            if name in self._creating:
                continue
            incarnation = (name, int(meta["id"]))
            if name in self.jobs:
                job = self.jobs[name]
                if job.id == incarnation[1]:
                    if meta["nodes"] != job.nodes:
                        me = self.settings.node
                        if job.root == me != meta["nodes"][0]:  # another node took it over
                            log.error(
                                "job %s: node %s took it over from this node; loading it again "
                                "as one of its nodes",
                                name,
                                meta["nodes"][0],
                            )
                            self.forget_and_reload(job)
                            continue
                        self.move_root(job, list(meta["nodes"]))
                    job.since = int(meta.get("since", 0))  # a takeover moves it
                    if job.root != self.settings.node:
                        v = await self.journal.version(name)
                        if v > job.version:
                            self.advance_remote(job, v)
                    continue
                log.info("job %s was created again (id %d -> %d)", name, job.id, incarnation[1])
                self._forget(job)
            if self.settings.node not in meta["nodes"] or incarnation in self._skip:
                continue
            job = self._make_job(meta, wire.ModelSpec.from_json(meta["spec"]))
            job.version = await self.journal.version(name)
            if meta["nodes"][0] == self.settings.node and not await recovery.recover_model(
                self, job
            ):
                job.ns.close()
                self._skip.add(incarnation)
                continue
            self._install(job)
            await recovery.recover_round(self, job)
            if job.root != self.settings.node:
                self._prefetch(job)
        if self.jobs:
            for name, revoked in (await self.journal.revoked(list(self.jobs))).items():
                if name in self.jobs:
                    self.jobs[name].revoked |= revoked

    def advance_remote(self, job: Job, version: int) -> None:
        """A job whose root is another node published ``version``: open the next round here,
        and fetch the new model at once (this node's clients download it next, and it is what
        this node adopts the job from should the root die: :mod:`gateway.takeover`).

        Updates of the round that ends here which no partial carried on (a slot that had not
        finished: the root published without them) are counted as dropped
        (:func:`gateway.forward.drop_unfinished`)."""
        if job.engine is not None:
            forward.drop_unfinished(
                self,
                job,
                job.engine,
                f"round {job.engine.round} ended (root {job.root} published version {version}) "
                "before the slot finished here",
            )
            job.engine.close()
        job.version = version
        job.model_bytes = b""
        self.open_round(job)
        self._prefetch(job)

    def _prefetch(self, job: Job) -> None:
        """Fetch ``job``'s current model from its root in the background (a non-root node)."""
        if self.loop is not None and not self._stop.is_set():
            self.background.spawn(
                self._prefetch_model(job, job.version), f"prefetch:{job.name}/{job.version}"
            )

    async def _prefetch_model(self, job: Job, version: int) -> None:
        for attempt in range(5):
            if job.version != version or job.model_bytes or self.jobs.get(job.name) is not job:
                return
            try:
                await self.fetch_root_model(job)
                return
            except (GatewayError, httpx.HTTPError, KeyError, ValueError) as exc:
                log.debug("job %s: prefetch of model v%d failed: %s", job.name, version, exc)
            await asyncio.sleep(0.2 * 2**attempt)

    async def follow_root(self, job: Job) -> None:
        """Take ``job``'s node order from the journal now: a plan with the top on a new root
        may arrive before the housekeeping loop reads it (a root this node was is left to
        that loop, which loads the job again)."""
        meta = await self.journal.job(job.name)
        if (
            meta is not None
            and int(meta["id"]) == job.id
            and meta["nodes"] != job.nodes
            and job.root != self.settings.node
        ):
            self.move_root(job, list(meta["nodes"]))

    def move_root(self, job: Job, nodes: list[str]) -> None:
        """The journal gives ``job`` a new node order (another node took it over, see
        :mod:`gateway.takeover`): its root is ``nodes[0]`` from now on. The open round keeps
        its plan until the control plane pushes one with the top on the new root; later
        rounds' own plan follows the new order."""
        log.warning("job %s: root node %s -> %s", job.name, job.root, nodes[0])
        job.nodes = list(nodes)
        job.base_plan = self.planner(job.goal, job.clients, job.nodes)

    async def delete_job(self, name: str) -> None:
        """Forget a job on this node: its objects, endpoint and (on its root) its journal."""
        job = self.job(name)
        self._forget(job)
        if job.root == self.settings.node:
            await self.journal.delete_job(name)
        log.info("job %s deleted on node %s", name, self.settings.node)

    def forget_and_reload(self, job: Job) -> None:
        """Forget ``job`` here and load it again from the journal at the next read (another
        node took it over from this one: it comes back as one of its nodes)."""
        self._forget(job)
        self._skip.discard((job.name, job.id))

    def _forget(self, job: Job) -> None:
        """Drop ``job`` from this node (its round, endpoint, store objects); never reload it."""
        del self.jobs[job.name]
        self._skip.add((job.name, job.id))
        if job.engine is not None:
            job.engine.close()
        if job.endpoint is not None:
            job.endpoint.close()
        if self.handoff is not None:
            self.handoff.withdraw(job.ns)
        job.ns.close()

    async def revoke_client(self, job: Job, client: str, *, force: bool) -> dict[str, Any]:
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
        await self.journal.revoke(job.name, client)
        job.revoked.add(client)
        log.warning("job %s: client %s revoked", job.name, client)
        return {
            "job": job.name,
            "client": client,
            "revoked": sorted(job.revoked),
            "short_nodes": {n: {"clients": h, "goal": g} for n, (h, g) in short.items()},
        }

    def job(self, name: str) -> Job:
        job = self.jobs.get(name)
        if job is None:
            raise JobNotFound(f"no job {name!r} on node {self.settings.node}")
        return job

    # -- rounds --------------------------------------------------------------------------------
    def open_round(self, job: Job) -> None:
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
            self._on_result(job, res)

        def forward(slot: Slot, inp: Input) -> None:
            self._forward(job, slot, inp)

        def persist(sid: int, inp: Input, release: Callable[[], None]) -> None:
            self._persist(job, r, sid, inp, release)

        def checkpoint(
            sid: int, inp: Input, children: list[int], release: Callable[[], None]
        ) -> None:
            self._persist(job, r, sid, inp, release, children=children)

        pushed = job.pending_plans.pop(r, None)
        for old in [k for k in job.pending_plans if k < r]:
            del job.pending_plans[old]
        job.plan = pushed[0] if pushed is not None else job.base_plan
        job.awaiting_plan = pushed is None and job.managed
        common: dict[str, Any] = dict(
            job_id=job.id,
            node=self.settings.node,
            round=r,
            plan=job.plan,
            store=job.ns,
            gateway_ep=job.endpoint.id,
            send=job.endpoint.send,
            publish=publish,
            forward=forward,
            persist=persist,
            checkpoint=checkpoint,
            refused=lambda _exc: self.metrics.store_refusals.inc(),
            failed=self.metrics.aggregator_failures.inc,
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
                width=lambda: sum(1 for i in self.router.endpoints().values() if not i.local),
                **common,
            )
        else:
            job.engine = RoundEngine(**common, lazy=self.settings.lazy)
        if pushed is not None:
            job.engine.plan_version = pushed[1]
            log.info("job %s round %d opens with the pushed plan v%s", job.name, r, pushed[1])
        elif job.awaiting_plan:
            log.info("job %s round %d opens awaiting the control plane's plan", job.name, r)
        job.times.append(RoundTimes(r))

    # -- the control plane's routes (bodies in gateway.control) -----------------------------
    def push_plan(self, job: Job, rnd: int, data: Any) -> dict[str, Any]:
        """``PUT /v1/jobs/{job}/rounds/{r}/plan``: see :func:`gateway.control.push_plan`."""
        from gateway import control

        return control.push_plan(self, job, rnd, data)

    def close_round(self, job: Job, rnd: int, received: dict[str, int] | None) -> dict[str, Any]:
        """``POST /v1/jobs/{job}/rounds/{r}/close``: see :func:`gateway.control.close_round`."""
        from gateway import control

        return control.close_round(self, job, rnd, received)

    def load(self, job: Job) -> dict[str, Any]:
        """Queue length and its factors: see :func:`gateway.control.load`."""
        from gateway import control

        return control.load(self, job)

    def _persist(
        self,
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
        me = self.settings.node
        rec: dict[str, Any] = {
            "key": inp.key.hex(),
            "weight": inp.weight,
            "count": inp.count,
            "clients": list(inp.clients),
        }

        def still() -> bool:
            eng = job.engine
            return (
                self.jobs.get(job.name) is job
                and eng is not None
                and eng.round == rnd
                and not eng.closed
            )

        async def run() -> None:
            async with job.journal_lock:
                if children is None:
                    await self.retry(
                        "slot_done",
                        lambda: self.journal.slot_done(job.name, rnd, slot, rec, node=me),
                        still,
                    )
                else:
                    rec["children"] = children
                    await self.retry(
                        "slot_checkpoint",
                        lambda: self.journal.slot_checkpoint(job.name, rnd, slot, rec, node=me),
                        still,
                    )
            release()

        self.background.spawn(run(), f"journal:{job.name}/{rnd}/{slot}")

    def pump(self, job: Job) -> None:
        """Give the job's waiting slots endpoints (granting them the job); see gateway.endpoints.

        Never raises: its callers have already acknowledged what they hand the round (an
        upload journaled, a frame taken), and the housekeeping loop, which pumps every job
        every few milliseconds, must go on. A failure leaves the slots waiting for the next
        pump; it is logged (once in a row per job) and counted as a ``pump`` task failure."""
        from gateway.endpoints import assign

        try:
            short = assign(self, job)
        except Exception:
            self.metrics.task_failures.labels(task="pump").inc()
            if job.name not in self._pump_failing:
                self._pump_failing.add(job.name)
                log.exception("job %s: giving its slots endpoints failed; tried again", job.name)
            return
        self._pump_failing.discard(job.name)
        if short:
            self.shortage[job.name] = short
        else:
            self.shortage.pop(job.name, None)

    def _rx(self, job: Job) -> None:
        ep = job.endpoint
        assert ep is not None and self.loop is not None
        while not self._stop.is_set():
            try:
                f = ep.recv(timeout=0.5)
            except bpf.EndpointClosed:
                return
            if f is not None:
                self.loop.call_soon_threadsafe(self._on_frame, job, f)

    def _on_frame(self, job: Job, f: bpf.Frame) -> None:
        eng = job.engine
        if eng is not None:
            eng.on_frame(f)
            self.pump(job)

    def _disconnect_threadsafe(self, endpoint_id: int) -> None:
        if self.loop is not None and not self._stop.is_set():
            self.loop.call_soon_threadsafe(self._on_disconnect, endpoint_id)

    def _on_disconnect(self, endpoint_id: int) -> None:
        for job in self.jobs.values():
            if job.engine is not None and job.engine.on_disconnect(endpoint_id):
                self.metrics.redeliveries.inc()
                self.pump(job)

    def _on_result(self, job: Job, res: Input) -> None:
        eng = job.engine
        assert eng is not None
        if job.times:
            job.times[-1].result_ns = time.monotonic_ns()
        self.background.spawn(publish_round(self, job, eng, res), f"publish:{job.name}/{eng.round}")

    def _forward(self, job: Job, slot: Slot, inp: Input) -> None:
        eng = job.engine  # the round whose slot finished: the task may start in a later one
        assert eng is not None
        self.background.spawn(
            forward.send_partial(self, job, eng, slot, inp),
            f"forward:{job.name}/{eng.round}/{slot.id}",
        )

    async def fetch_root_model(self, job: Job) -> None:
        """Non-root nodes serve the model they fetch from the root node's gateway."""
        url = self.peer_url(job.root)
        if url is None:
            raise GatewayError(
                f"model lives on node {job.root}; no peer URL configured or discovered",
                status=503,
                code="no_peer",
            )
        r = await self.peers.get(
            f"{url}/v1/jobs/{job.name}/model", headers={"Authorization": f"Bearer {self.secret}"}
        )
        r.raise_for_status()
        version = int(r.headers["x-model-version"])
        if version > job.version:
            # Open the next round too: setting only the version would leave this node on the
            # old round for good (the housekeeping loop advances only when the version grows).
            self.advance_remote(job, version)
        if version >= job.version:
            job.model_bytes = r.content

    async def _housekeeping(self) -> None:
        # Not ``while True``: a cancel that lands in a Redis call can be lost inside redis-py
        # (seen with redis 8.1 on Python 3.11), and this loop would then outlive the stop and
        # hang ``asyncio.Runner.close`` (issue 18). The stop flag ends it whatever happens.
        while not self._stop.is_set():
            await asyncio.sleep(0.02)
            for job in list(self.jobs.values()):
                self.pump(job)
            if int(time.monotonic() * 50) % 10 == 0:
                for job in list(self.jobs.values()):
                    if job.engine is not None and job.engine.rerun_stalled(self.settings.stall_s):
                        self.metrics.redeliveries.inc()
                with contextlib.suppress(Exception):
                    await self._load_jobs()


async def _read_minio(read: Callable[..., T], *args: Any) -> T:
    """``read(*args)`` (a checkpoint read) off the event loop; 503 ``checkpoints_unavailable``
    when MinIO cannot be read."""
    from fedfaas.checkpoints import CheckpointError

    try:
        return await asyncio.to_thread(read, *args)
    except CheckpointError as exc:
        raise GatewayError(
            f"MinIO cannot be read now ({exc}); try again when it is back",
            status=503,
            code="checkpoints_unavailable",
        ) from None
