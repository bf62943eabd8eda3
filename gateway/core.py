"""The node gateway, assembled: its state, its lifecycle (start, housekeeping, stop), its
HTTP front door, and each operation its parts call (:class:`gateway.node.Node`) bound to the
module that implements it (:mod:`gateway.creation`, :mod:`gateway.membership`,
:mod:`gateway.round_io`, :mod:`gateway.control`, :mod:`gateway.flstore`).

Peers (the other node gateways: a job's root receives its cross-node partials and serves its
model) are the static ``peers`` setting over those found behind ``peers_service``
(:mod:`core.discovery`, refreshed every ``discovery_interval`` seconds); see
:meth:`Gateway.peer_url`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from pathlib import Path
from typing import Any

import httpx

import bpf
from core import server_names
from core.auth import bearer, read_token_file
from core.discovery import Discovery
from core.objstore import check_root
from core.objstore.handoff import HandoffServer
from core.objstore.root import private_dir
from core.redis_wait import wait_for_redis
from gateway import auth, callers, control, creation, flstore, membership, recovery, round_io
from gateway.api import build_app
from gateway.asgi import AsgiExchange
from gateway.background import Background, JournalRetry
from gateway.bodies import MemoryBudget
from gateway.errors import JobNotFound
from gateway.http import Exchange, HttpServer, Request
from gateway.ingest import PARTIAL, UPLOAD, PartialExchange, UploadExchange
from gateway.jobs import Job
from gateway.journal import Journal
from gateway.metrics import Metrics
from gateway.plan import Planner, static_plan
from gateway.settings import GatewaySettings

log = logging.getLogger(__name__)
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
        self.skip: set[tuple[str, int]] = set()
        self.creating: set[str] = set()  # jobs create_job is writing to the journal now
        #: bytes of request bodies held at once, all routes and jobs (``max_inflight_bytes``)
        self.budget = MemoryBudget(settings.max_inflight_bytes)
        self.metrics = Metrics(
            settings.node, self.jobs, self.budget, lambda: getattr(self, "router", None)
        )
        self.secret = ""
        self.checkpoints: Any = None
        self.journal: Journal
        self.router: bpf.RouterServer
        tls = settings.tls()
        #: over TLS the internal routes need a platform client certificate too
        #: (:mod:`gateway.callers`); without a CA, or with ``tls_client_certs="none"``, the
        #: server asks for none
        self.internal_certs = tls is not None and tls.ca is not None and tls.client_certs != "none"
        self.internal_names = callers.parse_names(settings.tls_internal_names)
        self.http = HttpServer(
            self.route, settings.read_timeout, tls.server_context() if tls else None
        )
        self.port = 0
        self.loop: asyncio.AbstractEventLoop | None = None
        self._stop = threading.Event()
        #: the tasks in flight (publications, forwards, journal records, ...): see
        #: :mod:`gateway.background`
        self.background = Background(self.metrics.task_failures)
        #: runs a journal operation until Redis takes it (``retry_max_s``)
        self.retry = JournalRetry(self.metrics.journal_retries, settings.retry_max_s, self._stop)
        self.rx_threads: list[threading.Thread] = []
        self._app: Any = None
        #: the other node gateways (partials to a job's root, its model from there)
        #: (with TLS: verified against the platform's CA, this gateway's certificate presented)
        #: the peers discovered are verified against their node's name (core.server_names)
        self.peer_names = server_names.transport(tls.client_context() if tls else True)
        self.peers = httpx.AsyncClient(timeout=120, transport=self.peer_names)
        #: peers found behind ``peers_service`` (this node left out), refreshed by a task
        self.discovered: dict[str, str] = {}
        self.discovery = (
            Discovery(settings.peers_service, tls=tls) if settings.peers_service else None
        )
        #: slots of open rounds waiting for an endpoint after the last assignment, per job
        self.shortage: dict[str, int] = {}
        self.pump_failing: set[str] = set()  # jobs whose last pump raised (logged once)
        self.engine_headers: dict[str, str] = {}
        #: lends published rounds' updates to this node's cache functions (``handoff_ttl_s``)
        self.handoff: HandoffServer | None = None
        self._made_dirs: list[Path] = []

    # -- lifecycle -----------------------------------------------------------------------------
    async def start(self) -> Gateway:
        s = self.settings
        check_root(s.shm_root)  # a squatted or loose store root is refused before anything
        self.loop = asyncio.get_running_loop()
        s.state_dir.mkdir(parents=True, exist_ok=True)
        self.secret = auth.load_or_create_secret(s.secret_path())
        # the cache engine's service token, read once: a missing file stops the gateway here
        tf = s.engine_token_file if s.engine_url else None
        self.engine_headers = bearer(read_token_file(tf, "engine token")) if tf else {}
        self.journal = Journal(s.redis_url, s.redis_credentials_file)
        await wait_for_redis(self.journal.r, f"gateway {s.node}")
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
        if s.tls_cert_file is not None and not self.internal_certs:
            log.warning(
                "no tls_ca_file or tls_client_certs=none: this gateway asks for no client "
                "certificate, so its internal routes (gateway.callers) are authorized by the "
                "admin secret alone"
            )
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
        from core.checkpoints import CheckpointWriter
        from core.secretfiles import read_credentials

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
            for th in self.rx_threads:
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
        # a static peer's URL keeps its host as the name checked
        static = self.settings.peers
        self.peer_names.set(
            server_names.discovered({n: u for n, u in found.items() if n not in static})
        )
        self.discovered = found

    def route(self, req: Request) -> Exchange:
        if self.internal_certs:  # before any other check: 403 without a platform certificate
            callers.require_platform_certificate(req, self.internal_names)
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

    def job(self, name: str) -> Job:
        job = self.jobs.get(name)
        if job is None:
            raise JobNotFound(f"no job {name!r} on node {self.settings.node}")
        return job

    def _disconnect_threadsafe(self, endpoint_id: int) -> None:
        if self.loop is not None and not self._stop.is_set():
            self.loop.call_soon_threadsafe(round_io.on_disconnect, self, endpoint_id)

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

    # -- the operations the parts call (gateway.node.Node), each the function that implements
    # it, bound to this gateway as its first argument
    create_job = creation.create_job
    newest_checkpoint = creation.newest_checkpoint
    server_opt_checkpoint = creation.server_opt_checkpoint
    _load_jobs = membership.load_jobs  # the housekeeping loop's read
    delete_job = membership.delete_job
    revoke_client = membership.revoke_client
    forget_and_reload = membership.forget_and_reload
    move_root = membership.move_root
    follow_root = membership.follow_root
    advance_remote = membership.advance_remote
    fetch_root_model = membership.fetch_root_model
    open_round = round_io.open_round
    pump = round_io.pump
    push_plan = control.push_plan
    close_round = control.close_round
    load = control.load
    offer_round = flstore.offer_round
    notify_engine = flstore.notify_engine
    checkpoint_client = flstore.checkpoint_client
