"""The node gateway as its parts see it: its state and the operations they call on it.

:class:`Node` names what the HTTP routes (:mod:`gateway.api`, :mod:`gateway.ingest`), the
control plane's routes (:mod:`gateway.control`), the round's I/O (:mod:`gateway.endpoints`,
:mod:`gateway.forward`, :mod:`gateway.publish`) and the job operations (:mod:`gateway.creation`,
:mod:`gateway.membership`, :mod:`gateway.round_io`, :mod:`gateway.flstore`, :mod:`gateway.recovery`,
:mod:`gateway.takeover`) use of one node gateway. They depend on this protocol, never on
:class:`gateway.core.Gateway`, which holds the state, binds each operation to the module that
implements it and is the only module that imports them all (the layers are checked by
``make lint``: ``[tool.importlinter]`` in ``pyproject.toml``).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from typing import Any, Protocol

import httpx

import bpf
from core.discovery import Discovery
from core.objstore.handoff import HandoffServer
from gateway.background import Background, JournalRetry
from gateway.bodies import MemoryBudget
from gateway.jobs import Job
from gateway.journal import Journal
from gateway.metrics import Metrics
from gateway.plan import Planner
from gateway.settings import GatewaySettings

__all__ = ["Node"]


class Node(Protocol):
    """One node gateway's state and operations (see DESIGN.md, "Data path of one round")."""

    settings: GatewaySettings
    #: the jobs this node runs, by name
    jobs: dict[str, Job]
    planner: Planner
    #: bytes of request bodies held at once, all routes and jobs (``max_inflight_bytes``)
    budget: MemoryBudget
    metrics: Metrics
    #: the admin secret the gateways share (client tokens are derived from it)
    secret: str
    #: the :class:`~core.checkpoints.CheckpointWriter` (None: no MinIO)
    checkpoints: Any
    journal: Journal
    router: bpf.RouterServer
    loop: asyncio.AbstractEventLoop | None
    #: the tasks in flight (publications, forwards, journal records, ...)
    background: Background
    #: runs a journal operation until Redis takes it (``retry_max_s``)
    retry: JournalRetry
    #: the other node gateways (partials to a job's root, its model from there)
    peers: httpx.AsyncClient
    discovery: Discovery | None
    #: slots of open rounds waiting for an endpoint after the last assignment, per job
    shortage: dict[str, int]
    #: jobs whose last pump raised (logged once in a row)
    pump_failing: set[str]
    #: (name, id) of jobs deleted here or impossible to resume: not reloaded
    skip: set[tuple[str, int]]
    #: jobs :func:`gateway.creation.create_job` is writing to the journal now
    creating: set[str]
    #: the jobs' receive threads (:func:`gateway.round_io.receive`)
    rx_threads: list[threading.Thread]
    #: the cache engine's service token, as request headers
    engine_headers: dict[str, str]
    #: lends published rounds' updates to this node's cache functions (``handoff_ttl_s``)
    handoff: HandoffServer | None

    @property
    def stopping(self) -> bool:
        """The gateway is stopping: background work ends (the journal keeps what it did)."""

    def job(self, name: str) -> Job:
        """The job ``name`` on this node (404 ``unknown_job`` when it has none)."""

    def peer_url(self, node: str) -> str | None:
        """Base URL of another node's gateway."""

    # -- jobs: gateway.creation, gateway.membership ---------------------------------------------
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
        """Create a job (:func:`gateway.creation.create_job`)."""

    async def newest_checkpoint(self, name: str) -> tuple[int, bytes] | None:
        """Job ``name``'s newest checkpointed model (:func:`gateway.creation.newest_checkpoint`)."""

    async def server_opt_checkpoint(self, name: str, rnd: int) -> bytes | None:
        """The server optimizer state after round ``rnd``
        (:func:`gateway.creation.server_opt_checkpoint`)."""

    async def delete_job(self, name: str) -> None:
        """Forget a job on this node (:func:`gateway.membership.delete_job`)."""

    async def revoke_client(self, job: Job, client: str, *, force: bool) -> dict[str, Any]:
        """Revoke one client (:func:`gateway.membership.revoke_client`)."""

    def forget_and_reload(self, job: Job) -> None:
        """Forget ``job`` and load it again (:func:`gateway.membership.forget_and_reload`)."""

    def move_root(self, job: Job, nodes: list[str]) -> None:
        """A new node order for ``job`` (:func:`gateway.membership.move_root`)."""

    async def follow_root(self, job: Job) -> None:
        """Take ``job``'s node order from the journal (:func:`gateway.membership.follow_root`)."""

    def advance_remote(self, job: Job, version: int) -> None:
        """The root published ``version`` (:func:`gateway.membership.advance_remote`)."""

    async def fetch_root_model(self, job: Job) -> None:
        """Fetch the model from the root (:func:`gateway.membership.fetch_root_model`)."""

    # -- rounds: gateway.round_io, gateway.control ----------------------------------------------
    def open_round(self, job: Job) -> None:
        """Open ``job``'s next round here (:func:`gateway.round_io.open_round`)."""

    def pump(self, job: Job) -> None:
        """Give the job's waiting slots endpoints (:func:`gateway.round_io.pump`)."""

    def push_plan(self, job: Job, rnd: int, data: Any) -> dict[str, Any]:
        """A plan pushed by the control plane (:func:`gateway.control.push_plan`)."""

    def close_round(self, job: Job, rnd: int, received: dict[str, int] | None) -> dict[str, Any]:
        """Close a round at what arrived (:func:`gateway.control.close_round`)."""

    def load(self, job: Job) -> dict[str, Any]:
        """Queue length and its factors (:func:`gateway.control.load`)."""

    # -- FLStore: gateway.flstore ----------------------------------------------------------------
    def offer_round(self, job: Job, rnd: int) -> dict[str, Any] | None:
        """Offer a round's kept updates (:func:`gateway.flstore.offer_round`)."""

    def notify_engine(
        self, job: str, rnd: int, meta_key: str, handoff: dict[str, Any] | None = None
    ) -> None:
        """Tell the cache engine a round is in MinIO (:func:`gateway.flstore.notify_engine`)."""

    def checkpoint_client(self, job: Job, rnd: int, client: str, key: bytes) -> None:
        """Queue an accepted update for MinIO (:func:`gateway.flstore.checkpoint_client`)."""
