"""A job as one node gateway sees it: spec, plan, store namespace, open round, versions."""

from __future__ import annotations

import asyncio
import collections
import hmac
import json
import re
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

import bpf
from core import wire
from core.fedbuff import METADATA_KEY as FEDBUFF_KEY
from core.fedbuff import AsyncSpec
from core.objstore import Namespace
from core.robust import RobustRule
from core.server_opt import ServerOptimizer
from gateway import auth
from gateway.acceptance import Acceptor, UploadInFlight, journal_update, withdraw
from gateway.bodies import RETRY_AFTER_S
from gateway.errors import GatewayError, Unauthorized, UpdateRejected
from gateway.journal import Accepted
from gateway.plan import CLIENT_ID, Plan
from gateway.rounds import RoundEngine
from gateway.settings import GatewaySettings

if TYPE_CHECKING:
    from gateway.secagg import MaskedJob

JOB_NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,39}$")


class UploadNode(Acceptor, Protocol):
    """What :meth:`Job.accept` needs of its node gateway: an acceptance's (journal, retry),
    the node's name, and the pump that gives the round's slots endpoints."""

    @property
    def settings(self) -> GatewaySettings: ...

    def pump(self, job: Job) -> None: ...


def check_job_params(
    name: str,
    rounds: int,
    goal: int,
    clients: Sequence[str],
    nodes: Sequence[str] | None,
    node: str,
) -> list[str]:
    """Check a new job's parameters on ``node`` (before its body is read); returns its nodes.

    No ``clients``: the job's clients are the control plane's (enrolled there); each round's
    come with its pushed plan (:meth:`Job.admit`).
    """
    if not JOB_NAME.match(name):
        raise GatewayError(f"job name {name!r} must match {JOB_NAME.pattern}", code="bad_job_name")
    bad = [c for c in clients if not CLIENT_ID.match(c)]
    if bad or len(set(clients)) != len(clients):
        raise GatewayError(
            f"clients must be distinct ids matching {CLIENT_ID.pattern} (bad: {bad[:3]})",
            code="bad_clients",
        )
    if not 1 <= rounds <= 100000 or goal < 1 or (clients and goal > len(clients)):
        raise GatewayError(
            f"need 1 <= rounds and 1 <= goal <= {len(clients) or 'any number of'} clients",
            code="bad_job",
        )
    nodes = list(nodes or [node])
    if node != nodes[0]:
        raise GatewayError(f"create jobs on their root node {nodes[0]}", code="wrong_node")
    return nodes


@dataclass
class RoundTimes:
    round: int
    first_byte_ns: int = 0
    last_update_ns: int = 0
    result_ns: int = 0
    published_ns: int = 0
    #: updates in the round's published model (all nodes'), known to the node that published
    count: int = 0


#: losses a job's status lists (the count of dropped updates covers them all)
DROPS_KEPT = 32

#: model buffers a job keeps: the one served now and the one before it (a slow download may
#: still read it); the next model is encoded into the first one nothing reads any more
MODEL_BUFFERS = 2


@dataclass
class Job:
    """One job on this node."""

    name: str
    id: int
    spec: wire.ModelSpec
    rounds: int
    goal: int
    clients: list[str]
    nodes: list[str]
    plan: Plan
    ns: Namespace
    node: str
    #: drawn at creation, kept in the journal: the clients' tokens depend on it
    salt: str = ""
    #: client id -> its bearer token (from the admin secret, the job and its salt)
    tokens: dict[str, str] = field(default_factory=dict)
    #: a client's token from its id (the admin secret, the job and its salt): how an enrolled
    #: job's clients are admitted (:meth:`admit`)
    mint: Callable[[str], str] | None = None
    #: clients revoked by ``DELETE /v1/jobs/{job}/clients/{id}`` (here or on another node)
    revoked: set[str] = field(default_factory=set)
    version: int = 0
    global_key: bytes | None = None
    #: the job's server optimizer (:mod:`gateway.server_opt`); None: the round's FedAvg is
    #: the next model
    server_opt: ServerOptimizer | None = None
    #: the optimizer's state objects in the store (name -> key) on the root; none before round 1
    opt_keys: dict[str, bytes] = field(default_factory=dict)
    #: async mode (:mod:`gateway.fedbuff`); None: a sync job
    fedbuff: AsyncSpec | None = None
    #: an async job's older models an update may have trained on (version -> key), on the root
    history: dict[int, bytes] = field(default_factory=dict)
    #: a rule that needs every update at once (:mod:`gateway.sharded`); None: eager FedAvg
    rule: RobustRule | None = None
    #: secure aggregation (:mod:`gateway.secagg`, :mod:`gateway.unmask`); None: plain updates
    secagg: MaskedJob | None = None
    #: the oldest version an async job's update may have trained on: the version it was
    #: resumed or taken over at (the root holds no model before it), from the job's metadata
    since: int = 0
    model_bytes: bytes | memoryview = b""  # safetensors (a read-only view: no copy)
    #: buffers models were encoded into; one that nothing reads any more is written again
    model_buffers: list[np.ndarray] = field(default_factory=list)
    engine: RoundEngine | None = None
    #: on the root with a handoff: the round's accepted updates kept for FLStore (round ->
    #: client -> key, one lease each), offered when the round is published
    handoff: dict[int, dict[str, bytes] | None] = field(default_factory=dict)
    endpoint: bpf.Endpoint | None = None
    inflight: set[str] = field(default_factory=set)
    admission: collections.deque[asyncio.Future[None]] = field(default_factory=collections.deque)
    #: the last rounds' times (the gateway's ``round_times_kept`` of them)
    times: collections.deque[RoundTimes] = field(
        default_factory=lambda: collections.deque(maxlen=16)
    )
    #: acknowledged updates of this node that no published model holds, in all (a partial
    #: the root could not take, a round that ended without them): see :meth:`note_dropped`
    dropped_updates: int = 0
    #: the last such losses, each with its round, slot, clients and reason
    dropped: collections.deque[dict[str, Any]] = field(
        default_factory=lambda: collections.deque(maxlen=DROPS_KEPT)
    )
    #: plans pushed by the control plane for rounds not open here yet (round -> plan, version)
    pending_plans: dict[int, tuple[Plan, int | None]] = field(default_factory=dict)
    #: the control plane plans this job's rounds (it pushed a plan here, now or before a
    #: restart): a round whose plan has not arrived opens awaiting it (:attr:`awaiting_plan`)
    managed: bool = False
    #: the open round runs the gateway's own plan until the control plane's arrives: uploads
    #: get 409 ``round_not_open`` (the SDK sends again), so none lands in a slot the pushed
    #: plan would move
    awaiting_plan: bool = False
    #: orders the job's slot journal writes (a checkpoint never lands before an older one)
    journal_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    #: monotonic times of recent accepted updates (arrival rate k)
    arrivals: collections.deque[float] = field(
        default_factory=lambda: collections.deque(maxlen=512)
    )

    def __post_init__(self) -> None:
        self.client_set = set(self.clients)
        self.base_plan = self.plan  # the gateway's own plan, used when none was pushed
        self.by_token = {t: c for c, t in self.tokens.items()}

    @property
    def enrolled(self) -> bool:
        """The control plane enrolls the job's clients: it was created with none, and each
        round's clients come with the round's plan."""
        return not self.clients

    def admit(self, clients: Sequence[str]) -> None:
        """Let the clients an (enrolled) job's pushed plan names in: their tokens are good
        here from now on. 422 ``bad_plan`` for an id that is not one."""
        bad = [c for c in clients if not isinstance(c, str) or not CLIENT_ID.match(c)]
        if bad:
            raise GatewayError(
                f"plan names clients that are not ids matching {CLIENT_ID.pattern}: {bad[:3]}",
                status=422,
                code="bad_plan",
            )
        assert self.mint is not None
        for c in clients:
            if c not in self.client_set:
                self.client_set.add(c)
                self.tokens[c] = t = self.mint(c)
                self.by_token[t] = c

    def model_metadata(self, version: int) -> dict[str, str]:
        """The safetensors metadata of the model the job serves at ``version``: its round, and
        an async job's spec (a client sees the mode; a job resumed from the checkpoint keeps
        it)."""
        out = {"round": str(version)}
        if self.fedbuff is not None:
            out[FEDBUFF_KEY] = json.dumps(self.fedbuff.to_json(), sort_keys=True)
        if self.secagg is not None:
            out.update(self.secagg.model_metadata())
        return out

    def free_model_buffer(self) -> np.ndarray | None:
        """A buffer a model was encoded into that no view reads any more (neither
        :attr:`model_bytes` nor a response still being sent: each holds a reference to it), to
        encode the next model into pages already in place; None when every one is read (at
        most :data:`MODEL_BUFFERS` are kept)."""
        for buf in self.model_buffers:
            # references: the list, the loop variable and getrefcount's argument; any more is
            # a view of it still alive
            if sys.getrefcount(buf) <= 3:
                return buf
        return None

    def model_buffer_nbytes(self) -> int:
        """The size of a model buffer: the job's model encoded with a round number of 12
        digits, so that any round's model fits."""
        return wire.encoded_nbytes(self.spec, {**self.model_metadata(0), "round": "9" * 12})

    def reserve_model_buffers(self) -> None:
        """Have :data:`MODEL_BUFFERS` buffers of the model's encoded size (with room for a long
        round number) written once, so that no round's publication waits for page faults,
        the first ones included. Run on a job's root node when the job is installed."""
        nbytes = self.model_buffer_nbytes()
        while len(self.model_buffers) < MODEL_BUFFERS:
            buf = np.empty(nbytes, np.uint8)
            buf.fill(0)  # every page faulted in now, outside any round
            self.model_buffers.append(buf)

    def initial_model_view(self, body: bytes | memoryview) -> memoryview:
        """The initial model ``body`` (safetensors as the job was created with), served from a
        model buffer of its own: copied once into a buffer with room for any later model, which
        then counts as one of the :data:`MODEL_BUFFERS` that later rounds are encoded into (not a
        separate model-sized copy beside them). Read-only."""
        nbytes = self.model_buffer_nbytes()
        buf = np.empty(max(len(body), nbytes), np.uint8)
        buf[: len(body)] = np.frombuffer(body, np.uint8)
        view = buf.data[: len(body)]
        self.keep_model_buffer(view)
        return view.toreadonly()

    def keep_model_buffer(self, view: memoryview) -> None:
        """Remember the array behind a newly encoded model's view, for :meth:`free_model_buffer`."""
        buf: Any = view.obj
        while isinstance(buf, np.ndarray) and buf.base is not None:
            buf = buf.base
        if not isinstance(buf, np.ndarray) or any(b is buf for b in self.model_buffers):
            return
        self.model_buffers.append(buf)
        del self.model_buffers[:-MODEL_BUFFERS]

    def check_client(self, client: str, header: str | None) -> None:
        """Refuse a request of ``client`` unless ``header`` carries its token (401 otherwise)
        and it is not revoked (403 ``client_revoked``)."""
        tok = auth.bearer_token(header)
        want = self.tokens.get(client)
        if tok is None or want is None or not hmac.compare_digest(tok, want):
            raise Unauthorized(
                f"missing or wrong bearer token for client {client!r} of job {self.name!r} "
                f"(or no such client)"
            )
        if client in self.revoked:
            raise self.revoked_error(client)

    def client_of(self, header: str | None) -> str | None:
        """The client whose token ``header`` carries, or None."""
        tok = auth.bearer_token(header)
        return None if tok is None else self.by_token.get(tok)

    def revoked_error(self, client: str) -> GatewayError:
        return GatewayError(
            f"client {client!r} of job {self.name!r} was revoked: its uploads and model reads "
            f"are refused",
            status=403,
            code="client_revoked",
        )

    def short_nodes(self, revoked: set[str]) -> dict[str, tuple[int, int]]:
        """Nodes where the round's plan needs more updates than clients are left to send them,
        with ``revoked`` out: ``{node: (clients left, node goal)}`` (empty when none).

        A client the plan places on no node may upload anywhere: it counts for every node.
        Both the open round's plan and the gateway's own one (later rounds) are checked.
        """
        out: dict[str, tuple[int, int]] = {}
        for plan in {id(p): p for p in (self.plan, self.base_plan)}.values():
            left = collections.Counter(
                plan.client_nodes.get(c) for c in self.clients if c not in revoked
            )
            for node in {s.node for s in plan.slots}:
                goal = plan.node_goal(node)
                have = left[node] + left[None]
                if goal and have < goal:
                    out[node] = (have, goal)
        return out

    def arrival_rate(self, window: float = 10.0) -> float:
        """Updates accepted per second over the last ``window`` seconds (k)."""
        now = time.monotonic()
        recent = [t for t in self.arrivals if now - t <= window]
        if len(recent) < 2:
            return 0.0
        return len(recent) / max(now - recent[0], 1e-3)

    @property
    def root(self) -> str:
        return self.nodes[0]

    @property
    def open_round(self) -> int | None:
        return self.version + 1 if self.version < self.rounds else None

    def note_first_byte(self, t_ns: int) -> None:
        if (
            self.times
            and self.times[-1].round == self.version + 1
            and not self.times[-1].first_byte_ns
        ):
            self.times[-1].first_byte_ns = t_ns

    def check_round(self, rnd: int, client: str, node: str) -> None:
        """Refuse an upload that cannot count in the open round (before reading its body)."""
        open_r = self.open_round
        if open_r is None:
            raise UpdateRejected(
                f"job {self.name} finished all {self.rounds} rounds",
                status=409,
                code="job_finished",
                client_id=client,
                round=rnd,
            )
        if rnd == open_r + 1 and node != self.root:
            # the root published and opened it; this node follows in a moment (journal poll)
            raise UpdateRejected(
                f"round {rnd} is not open on this node yet (it follows the root node's "
                f"publication of model version {rnd - 1}); send again in a moment",
                status=409,
                code="round_not_open",
                client_id=client,
                round=rnd,
            )
        oldest = max(open_r - self.fedbuff.max_staleness, self.since + 1) if self.fedbuff else 0
        if self.fedbuff is not None and oldest <= rnd < open_r:
            pass  # an async job takes an update trained on a recent version into its buffer
        elif rnd != open_r:
            code = "stale_round" if rnd < open_r else "future_round"
            if self.fedbuff is not None and rnd < open_r:
                code = "too_stale"
            raise UpdateRejected(
                f"round {rnd} is not open; the open round is {open_r} (model version "
                f"{self.version})"
                + (
                    f", and this async job takes updates trained on version {oldest - 1} or "
                    f"newer (at most {self.fedbuff.max_staleness} versions old, none from "
                    f"before version {self.since})"
                    if code == "too_stale" and self.fedbuff is not None
                    else ""
                )
                + ": fetch the model and train on it",
                status=409,
                code=code,
                client_id=client,
                round=rnd,
            )
        if self.awaiting_plan:
            raise UpdateRejected(
                f"round {rnd} is not open on this node yet: it waits for the control plane's "
                "plan; send again in a moment",
                status=409,
                code="round_not_open",
                client_id=client,
                round=rnd,
            )
        why = self.plan.excluded.get(client)
        if why is not None:
            raise UpdateRejected(
                f"client {client} is dropped from round {rnd} before aggregation: FLStore's "
                f"{why.get('workload', '?')} flagged it in round {why.get('flagged_in', '?')}",
                status=403,
                code="client_excluded",
                client_id=client,
                round=rnd,
            )
        want = self.plan.client_nodes.get(client, node)
        if want != node and self.fedbuff is None:  # an async buffer takes them where they come
            raise UpdateRejected(
                f"client {client} uploads to node {want}, not {node}",
                status=409,
                code="wrong_node",
                client_id=client,
                round=rnd,
            )
        eng = self.engine
        if eng is not None and eng.round == open_r and eng.frozen:
            raise UpdateRejected(
                f"round {open_r} was closed by the control plane; it aggregates what arrived",
                status=409,
                code="round_closed",
                client_id=client,
                round=rnd,
            )
        if eng is None or eng.round != open_r:
            raise UpdateRejected(
                f"round {open_r} is not open on this node yet",
                status=409,
                code="round_not_open",
                client_id=client,
                round=rnd,
            )
        if client in eng.clients:
            raise UpdateRejected(
                f"client {client} already sent an update for round {open_r}",
                status=409,
                code="duplicate_client",
                client_id=client,
                round=rnd,
            )
        if client in self.inflight:  # it may still fail: a 409 would say it counts
            raise UploadInFlight(
                f"an update of client {client} for round {open_r} is still being received or "
                "journaled here (409 duplicate_client then, if it counts)",
                retry_after=RETRY_AFTER_S,
                client_id=client,
                round=rnd,
            )
        if eng.accepted + len(self.inflight) >= eng.capacity:
            raise UpdateRejected(
                f"round {open_r} already has its {eng.capacity} updates on this node"
                + (
                    "; this node's share of the buffer is full: send it again where the "
                    "control plane places you now, or here once the version advances"
                    if self.fedbuff
                    else ""
                ),
                status=409,
                code="round_full",
                client_id=client,
                round=rnd,
            )

    def buffer_of(self, rnd: int, samples: int) -> tuple[int, float]:
        """``(round, weight)`` an update uploaded to round ``rnd`` counts in now: in a sync
        job ``rnd`` and its sample count; in an async one the open buffer and the staleness
        weight (:mod:`gateway.fedbuff`)."""
        if self.fedbuff is None or self.open_round is None:
            return rnd, float(samples)
        buffer = self.open_round
        if buffer - rnd > self.fedbuff.max_staleness or rnd <= self.since:  # versions moved on
            raise UpdateRejected(
                f"round {rnd}'s update is now {buffer - rnd} versions old; this async job "
                f"takes updates at most {self.fedbuff.max_staleness} versions old: fetch the "
                "model and train on it",
                status=409,
                code="too_stale",
                client_id=None,
                round=rnd,
            )
        return buffer, self.fedbuff.weight(max(0, buffer - rnd))

    async def accept(
        self,
        gw: UploadNode,
        rnd: int,
        client: str,
        key: bytes,
        weight: float,
        meta: dict[str, float | int] | None = None,
        *,
        samples: int,
        base: int,
    ) -> None:
        """Journal a sealed update and hand it to the round (the caller answers 202 after).

        ``meta`` (the client's ``X-Client-Meta``) is kept in the journal record; the round's
        ``meta.json`` carries it as the client's metadata. An async job's update (round
        ``rnd``: its buffer) also records its sample count and the ``base`` version it
        trained on (a sync job's ``weight`` is its sample count, its base ``rnd - 1``).
        A journal write whose answer was lost is resolved first (:mod:`gateway.acceptance`:
        :class:`~gateway.acceptance.JournalRefused`, :class:`~gateway.acceptance.Unresolved`).
        """
        record: dict[str, Any] = {
            "key": key.hex(),
            "weight": weight,
            "node": gw.settings.node,
            "t": time.time(),
        }
        if self.fedbuff is not None:
            record["base"], record["samples"] = base, samples
        if meta:
            record["meta"] = meta
        # an async buffer applies at exactly K (its goal) updates: the journal counts them
        # over all nodes (a node's own capacity follows the clients placed on it)
        cap = self.goal if self.fedbuff is not None else 0
        done = await journal_update(gw, self, rnd, client, record, cap)
        if done is Accepted.DUPLICATE:
            raise UpdateRejected(
                f"client {client} already sent an update for round {rnd}",
                status=409,
                code="duplicate_client",
                client_id=client,
                round=rnd,
            )
        if done is Accepted.FULL:
            raise UpdateRejected(
                f"buffer {rnd} already has its {cap} updates; send it again once the "
                "version advances",
                status=409,
                code="round_full",
                client_id=client,
                round=rnd,
            )
        eng = self.engine
        if eng is None or eng.round != rnd or eng.full():
            await withdraw(gw, self, rnd, client, record["key"])
            raise UpdateRejected(
                f"round {rnd} closed while the update was uploading",
                status=409,
                code="stale_round",
                client_id=client,
                round=rnd,
            )
        eng.add_update(client, key, weight)
        self.arrivals.append(time.monotonic())
        if self.times and self.times[-1].round == rnd:
            self.times[-1].last_update_ns = time.monotonic_ns()
        gw.pump(self)

    def note_dropped(
        self, rnd: int, slot: int, clients: Sequence[str], count: int, reason: str
    ) -> None:
        """Record that ``count`` acknowledged updates of round ``rnd`` (slot ``slot``, from
        ``clients``) are in no published model, and why: the job's status shows it."""
        self.dropped_updates += count
        self.dropped.append(
            {
                "round": rnd,
                "slot": slot,
                "updates": count,
                "clients": list(clients),
                "reason": reason,
            }
        )

    def status(self) -> dict[str, Any]:
        eng = self.engine
        t = self.times[-1] if self.times else None
        last = next((x for x in reversed(self.times) if x.result_ns), None)
        return {
            "job": self.name,
            "id": self.id,
            "round": self.open_round or self.rounds,
            "version": self.version,
            "rounds": self.rounds,
            "goal": self.goal,
            "received": eng.accepted if eng else 0,
            "status": "done" if self.open_round is None else "running",
            "nodes": self.nodes,
            "node": self.node,
            "store": str(self.ns.path),
            "store_stats": self.ns.stats(),
            "progress": eng.progress() if eng else None,
            "dropped": {"updates": self.dropped_updates, "recent": list(self.dropped)},
            "current_round_first_byte_ns": t.first_byte_ns if t else 0,
            "last_round": None
            if last is None
            else {
                "round": last.round,
                "first_byte_ns": last.first_byte_ns,
                "last_update_ns": last.last_update_ns,
                "result_ns": last.result_ns,
                "published_ns": last.published_ns,
                "count": last.count,
                "first_byte_to_result_s": (last.result_ns - last.first_byte_ns) / 1e9
                if last.first_byte_ns
                else None,
            },
        }
