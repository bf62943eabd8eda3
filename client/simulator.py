"""Client simulator: K real PyTorch clients, R rounds, against one or more node gateways.

Each round every client fetches the global model from its assigned gateway (fixed, or asked of
the control plane every round), trains on its own non-IID shard, and uploads its full local
weights with its metadata (training loss, duration); the simulator then waits until every
gateway in use serves the next model version and evaluates that global model on the held-out
test set. Clients named in ``SimulatorConfig.malicious`` upload an attack instead (sign flip).
Clients run on a thread pool (PyTorch releases the GIL in its kernels; one intra-op thread each).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import torch

from client.data import ClientData, FederatedDigits
from client.errors import (
    ClientNotSelected,
    GatewayUnavailable,
    JobFailed,
    StaleRound,
    raise_for,
    unreachable,
)
from client.model import MODELS, bytes_to_state_dict, load_bytes_into, state_dict_to_bytes
from client.node import FLClient
from client.tls import CaFile, verify_for
from client.train import TrainConfig, evaluate, train_local

log = logging.getLogger(__name__)

Assignment = Mapping[str, str] | Callable[[str], str]
EventHook = Callable[[str, dict[str, Any]], None]


def round_robin(clients: Sequence[str], gateways: Sequence[str]) -> dict[str, str]:
    """Static client -> gateway URL map: client i goes to gateway i mod len(gateways)."""
    if not gateways:
        raise ValueError("need at least one gateway")
    return {c: gateways[i % len(gateways)] for i, c in enumerate(clients)}


def assignment_from_plan(
    client_nodes: Mapping[str, str], node_urls: Mapping[str, str]
) -> dict[str, str]:
    """Client -> gateway URL from a job plan's ``client_nodes`` and each node's URL."""
    missing = sorted({n for n in client_nodes.values() if n not in node_urls})
    if missing:
        raise ValueError(f"no gateway URL for nodes {missing}")
    return {c: node_urls[n] for c, n in client_nodes.items()}


class ControlPlaneAssignment:
    """Client -> gateway URL from the control plane's ``GET /v1/jobs/{job}/assignment``.

    The answer is ``{job, round, client, node, gateway_url}``; the simulator asks again at the
    start of every round, after :meth:`wait_round` saw that round open on the control plane,
    so placement changes between rounds are followed.
    """

    def __init__(
        self,
        control_plane_url: str,
        job: str,
        credential: str | Mapping[str, str],
        timeout: float = 10.0,
        ca_file: CaFile = None,
    ) -> None:
        self.base = control_plane_url.rstrip("/")
        self.job = job
        self.timeout = timeout
        self._verify = verify_for(ca_file)
        self._credential = credential
        self._client: str | None = None
        #: gateway URL -> the name its certificate is verified against (the answers'
        #: ``tls_name``: a gateway found by discovery at its pod's address names its node)
        self.tls_names: dict[str, str] = {}

    def _auth(self, client_id: str | None) -> tuple[dict[str, str], dict[str, str]]:
        """``(params, headers)``: the admin token, or the client's own token when given."""
        cred = self._credential
        if client_id is None:
            if not isinstance(cred, str):
                raise ValueError("ask for one client's assignment first (its token is needed)")
            return {}, {"Authorization": f"Bearer {cred}"}
        token = cred if isinstance(cred, str) else cred[client_id]
        return {"client": client_id}, {"Authorization": f"Bearer {token}"}

    def _get(self, path: str, params: dict[str, str], headers: dict[str, str]) -> Any:
        import httpx

        try:
            r = httpx.get(
                f"{self.base}{path}",
                params=params,
                headers=headers,
                timeout=self.timeout,
                verify=self._verify,
            )
        except httpx.TransportError as exc:
            raise unreachable(f"{self.base}{path}", exc, "GET") from exc
        raise_for(r)
        return r.json()

    def __call__(self, client_id: str) -> str:
        """The gateway URL of ``client_id`` for the open round (once the job is done: of the
        node holding the final model); :class:`~client.errors.JobFailed` when the job failed,
        :class:`~client.errors.ClientNotSelected` when the client is not in the round."""
        a = self.answer(client_id)
        url = str(a["gateway_url"])
        if a.get("tls_name"):
            self.tls_names[url] = str(a["tls_name"])
        return url

    def answer(self, client_id: str) -> dict[str, Any]:
        """The control plane's whole assignment of ``client_id`` (as :meth:`__call__`), with
        ``tls_name``: the name the gateway's certificate is verified against where not the
        URL's host (:class:`~client.node.FLClient`'s ``tls_name``)."""
        self._client = client_id
        params, headers = self._auth(client_id)
        return dict(self._get(f"/v1/jobs/{self.job}/assignment", params, headers))

    def wait_round(self, number: int, timeout: float = 120.0) -> None:
        """Until the control plane has round ``number`` (or a later one) open for clients;
        :class:`~client.errors.JobFailed` when the job failed meanwhile."""
        deadline = time.monotonic() + timeout
        params, headers = self._auth(None if isinstance(self._credential, str) else self._client)
        while True:
            view = self._get(f"/v1/jobs/{self.job}", params, headers)
            if view.get("failed"):
                raise JobFailed.of(self.job, str(view["failed"]))
            cur = view.get("round") or {}
            if int(cur.get("number") or 0) >= number and cur.get("state") == "open":
                return
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"round {number} of {self.job} not open on the control plane after "
                    f"{timeout:.0f}s (now: {cur.get('number')} {cur.get('state')})"
                )
            time.sleep(0.05)


def control_plane_assignment(
    control_plane_url: str,
    job: str,
    credential: str | Mapping[str, str],
    timeout: float = 10.0,
    ca_file: CaFile = None,
) -> ControlPlaneAssignment:
    """Client -> gateway URL from the control plane (see :class:`ControlPlaneAssignment`).

    ``credential`` is the control plane's admin token (the gateways' admin secret) or the
    clients' tokens (client id -> its token, from the job's creation answer): each client then
    asks with its own. ``ca_file``: the platform's CA, to verify an ``https`` control plane.
    """
    return ControlPlaneAssignment(control_plane_url, job, credential, timeout, ca_file)


#: What a malicious client of :class:`SimulatorConfig` does: ``"sign-flip"`` uploads
#: ``g - (w - g) = 2g - w`` (its honest update reversed) instead of its trained weights ``w``,
#: ``g`` being the global model it trained from.
ATTACKS = ("sign-flip",)


@dataclass(frozen=True)
class SimulatorConfig:
    """Rounds, training, concurrency, the model, and which clients misbehave.

    ``model`` names the architecture (:data:`client.model.MODELS`: ``"cnn"``, ``"softmax"``).
    ``malicious`` maps client ids to an attack of :data:`ATTACKS`, e.g.
    ``{"client-007": "sign-flip"}``; those clients train as usual, then upload the attack's
    weights (and report their honest loss and duration). ``slow`` simulates slower devices.
    """

    rounds: int = 5
    train: TrainConfig = field(default_factory=TrainConfig)
    workers: int = 4
    seed: int = 0
    round_timeout: float = 300.0
    torch_threads: int | None = 1
    model: str = "cnn"
    malicious: Mapping[str, str] = field(default_factory=dict)
    #: client id -> how many times slower it is than it trains here: after its local
    #: training it waits ``(factor - 1)`` times the training's duration (a slow device)
    slow: Mapping[str, float] = field(default_factory=dict)
    #: the platform's CA certificate, to verify ``https`` gateways (``fedfaas up``:
    #: ``.state/secrets/tls/ca.crt``); None trusts the system's CAs
    ca_file: CaFile = None


@dataclass(frozen=True)
class ClientRound:
    client: str
    gateway: str
    round: int
    num_samples: int
    train_loss: float
    train_seconds: float
    upload_seconds: float
    accepted: bool  # False when the round had closed (409) before this upload arrived
    malicious: bool = False


@dataclass(frozen=True)
class RoundReport:
    round: int
    version: int
    accuracy: float
    loss: float
    seconds: float
    accepted: int
    late: int
    mean_train_seconds: float
    mean_upload_seconds: float


class Simulator:
    """Runs the clients of ``data`` for ``config.rounds`` rounds of job ``job``.

    Parameters
    ----------
    job : job name (already created on the gateways).
    data : the federated split; client ids must have tokens.
    tokens : client id -> bearer token (from job creation).
    assignment : client id -> gateway URL, as a mapping (fixed) or a callable (asked again
        before every round, e.g. :func:`control_plane_assignment`; one with a
        ``wait_round(number)`` method is first asked to wait until that round is open).
    config : rounds, training, concurrency, model and malicious clients.
    on_event : optional hook called as ``on_event("upload", {...})`` after each upload (with
        the uploaded bytes as ``data`` and the client's metadata as ``meta``) and
        ``on_event("round", {...})`` after each round (the report's fields plus the global
        model bytes as ``global_model``), from worker threads.

    Each upload carries the client's metadata (``X-Client-Meta``): its mean training loss
    ``loss``, the mean squared per-sample loss ``loss_sq_mean`` and ``duration_s``, the
    seconds its local training took.
    """

    def __init__(
        self,
        job: str,
        data: FederatedDigits,
        tokens: Mapping[str, str],
        assignment: Assignment,
        config: SimulatorConfig | None = None,
        on_event: EventHook | None = None,
    ) -> None:
        self.job = job
        self.data = data
        self.config = config or SimulatorConfig()
        self.on_event = on_event
        missing = [c.client_id for c in data.clients if c.client_id not in tokens]
        if missing:
            raise ValueError(f"no token for clients {missing[:5]}")
        ids = {c.client_id for c in data.clients}
        for cid, attack in self.config.malicious.items():
            if cid not in ids or attack not in ATTACKS:
                raise ValueError(
                    f"malicious {{{cid!r}: {attack!r}}}: need a client of the data and an "
                    f"attack in {ATTACKS}"
                )
        self._model = MODELS[self.config.model]
        self._assignment = assignment
        self._tokens = dict(tokens)
        self._dynamic = callable(assignment)
        self._resolve: Callable[[str], str] = (
            assignment if callable(assignment) else assignment.__getitem__
        )
        self.gateway_of: dict[str, str] = {}
        self.clients: dict[str, FLClient] = {}
        self._monitors: dict[str, FLClient] = {}
        self._assign()

    def _assign(self) -> None:
        """(Re)resolve every client's gateway; clients that moved get a new connection."""
        for shard in self.data.clients:
            self._connect(shard.client_id, self._resolve(shard.client_id))
        self._monitors = {
            url: self.clients[cid] for cid, url in reversed(list(self.gateway_of.items()))
        }

    def _connect(self, cid: str, url: str) -> FLClient:
        """Client ``cid``'s connection to ``url`` (a new one when it moved there)."""
        if self.gateway_of.get(cid) != url:
            if cid in self.clients:
                self.clients[cid].close()
            self.clients[cid] = self._client_at(cid, url)
            self.gateway_of[cid] = url
        return self.clients[cid]

    def _client_at(self, cid: str, url: str) -> FLClient:
        """A new connection of client ``cid`` to the gateway at ``url``."""
        return FLClient(
            url,
            self.job,
            cid,
            self._tokens[cid],
            ca_file=self.config.ca_file,
            tls_name=self._tls_name(url),
        )

    def _tls_name(self, url: str) -> str | None:
        """The name ``url``'s certificate is verified against, where the assignment gave one
        (:attr:`ControlPlaneAssignment.tls_names`); None: the URL's host."""
        return getattr(self._assignment, "tls_names", {}).get(url)

    def close(self) -> None:
        for c in self.clients.values():
            c.close()

    def __enter__(self) -> Simulator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _emit(self, kind: str, info: dict[str, Any]) -> None:
        if self.on_event is not None:
            self.on_event(kind, info)

    def _client_round(
        self, shard: ClientData, round_no: int, index: int, base_version: int
    ) -> ClientRound:
        sdk = self.clients[shard.client_id]
        glob = sdk.wait_for_version(base_version, timeout=self.config.round_timeout)
        model = load_bytes_into(self._model(), glob.data)
        t0 = time.perf_counter()
        seed = self.config.seed * 1_000_003 + round_no * 10_007 + index
        res = train_local(model, shard.x, shard.y, self.config.train, seed=seed)
        self._slow_down(shard.client_id, time.perf_counter() - t0)
        t1 = time.perf_counter()
        accepted = True
        attack = self.config.malicious.get(shard.client_id)
        weights = model.state_dict()
        if attack == "sign-flip":
            g = bytes_to_state_dict(glob.data)
            weights = {k: 2 * g[k] - v for k, v in weights.items()}
        payload = state_dict_to_bytes(weights)
        meta = {
            "loss": res.mean_loss,
            "loss_sq_mean": res.loss_sq_mean,
            "duration_s": t1 - t0,
        }
        try:
            sdk.upload(round_no, payload, res.num_samples, meta=meta)
        except StaleRound as exc:
            log.info(
                "%s: round %d closed before its upload (%s)", shard.client_id, round_no, exc.error
            )
            accepted = False
        t2 = time.perf_counter()
        out = ClientRound(
            shard.client_id,
            self.gateway_of[shard.client_id],
            round_no,
            res.num_samples,
            res.mean_loss,
            t1 - t0,
            t2 - t1,
            accepted,
            attack is not None,
        )
        self._emit(
            "upload",
            {
                "round": round_no,
                "client": shard.client_id,
                "accepted": accepted,
                "gateway": out.gateway,
                "num_samples": res.num_samples,
                "data": payload,
                "meta": meta,
                "malicious": attack,
            },
        )
        return out

    def _slow_down(self, client: str, seconds: float) -> None:
        factor = self.config.slow.get(client, 1.0)
        if factor > 1.0:
            time.sleep((factor - 1.0) * seconds)

    def _wait_all(self, version: int) -> bytes:
        data = b""
        for sdk in self._monitors.values():
            data = sdk.wait_for_version(version, timeout=self.config.round_timeout).data
        return data

    def evaluate_bytes(self, weights: bytes) -> tuple[float, float]:
        """Accuracy and loss of a global model (safetensors bytes) on the test set."""
        res = evaluate(load_bytes_into(self._model(), weights), self.data.test_x, self.data.test_y)
        return res.accuracy, res.loss

    def run(self) -> list[RoundReport]:
        """Run the rounds; returns one report per round, global-model accuracy included."""
        if self.config.torch_threads is not None:
            torch.set_num_threads(self.config.torch_threads)
        first = next(iter(self._monitors.values())).status()
        round_no, version = int(first["round"]), int(first["version"])
        total_rounds = int(first.get("rounds", round_no + self.config.rounds - 1))
        last = min(total_rounds, round_no + self.config.rounds - 1)
        reports: list[RoundReport] = []
        reports_start = round_no
        with ThreadPoolExecutor(self.config.workers, thread_name_prefix="fl-client") as pool:
            while round_no <= last:
                t0 = time.perf_counter()
                wait_round = getattr(self._assignment, "wait_round", None)
                if wait_round is not None:
                    wait_round(round_no, self.config.round_timeout)
                if self._dynamic and (round_no > reports_start or wait_round is not None):
                    self._assign()  # a placement service may move clients between rounds
                futs = [
                    pool.submit(self._client_round, shard, round_no, i, version)
                    for i, shard in enumerate(self.data.clients)
                ]
                results = [f.result() for f in futs]
                weights = self._wait_all(version + 1)
                seconds = time.perf_counter() - t0
                acc, loss = self.evaluate_bytes(weights)
                ok = [r for r in results if r.accepted]
                report = RoundReport(
                    round=round_no,
                    version=version + 1,
                    accuracy=acc,
                    loss=loss,
                    seconds=seconds,
                    accepted=len(ok),
                    late=len(results) - len(ok),
                    mean_train_seconds=sum(r.train_seconds for r in results) / len(results),
                    mean_upload_seconds=sum(r.upload_seconds for r in results) / len(results),
                )
                log.info("round %d: accuracy %.3f, %.2fs", round_no, acc, seconds)
                reports.append(report)
                self._emit("round", {**report.__dict__, "global_model": weights})
                round_no, version = round_no + 1, version + 1
        return reports

    # -- async mode (FedBuff) --------------------------------------------------------------

    def run_async(self) -> list[RoundReport]:
        """Run the clients of an async job (``submit_job(fedbuff=...)``) until it has
        published ``config.rounds`` more versions; one report per version seen, its
        ``seconds`` counted from the start.

        Every client loops on its own thread: it fetches the newest model, trains on it
        (slowed down as ``config.slow`` says) and uploads to round ``version + 1``. An update
        the node cannot take now (its buffer share is full, or the version moved while it
        uploaded) is sent again once a new version is out, or at once to another node once
        the control plane places the client there (a round's share of the buffer on each node
        follows that round's placement), or at once where the round is not open yet (it waits
        for its plan: see :meth:`_send_async`): it counts then. One
        trained on a model too old any more (409 ``too_stale``) is dropped, and the client
        trains again on the newest. A client trains once per version. A job that publishes
        no new version for ``config.round_timeout`` s raises ``TimeoutError`` saying each
        node's open round and what each client is doing (waiting for which version, or
        refused with which 409).
        """
        import threading

        if self.config.torch_threads is not None:
            torch.set_num_threads(self.config.torch_threads)
        cid, url = next(iter(self.gateway_of.items()))
        monitor = self._client_at(cid, url)  # clients may move: its own
        first = monitor.status()
        start = int(first["version"])
        last = min(int(first.get("rounds", start + self.config.rounds)), start + self.config.rounds)
        stop = threading.Event()
        lock = threading.Lock()
        counts = {"accepted": 0, "dropped": 0}
        errors: list[BaseException] = []
        #: what each client is doing (waiting, training, uploading, refused), for the report
        #: of a stalled job
        doing: dict[str, str] = {}

        def client_loop(index: int, shard: ClientData) -> None:
            base = start - 1
            try:
                while not stop.is_set():
                    sdk = self._client_for(shard.client_id)
                    doing[shard.client_id] = f"waits for version {base + 1}"
                    glob = sdk.wait_for_version(base + 1, timeout=self.config.round_timeout)
                    if glob.version >= last:
                        return
                    base = glob.version
                    doing[shard.client_id] = f"trains on version {base}"
                    model = load_bytes_into(self._model(), glob.data)
                    t0 = time.perf_counter()
                    seed = self.config.seed * 1_000_003 + base * 10_007 + index
                    res = train_local(model, shard.x, shard.y, self.config.train, seed=seed)
                    self._slow_down(shard.client_id, time.perf_counter() - t0)
                    payload = state_dict_to_bytes(model.state_dict())
                    meta = {
                        "loss": res.mean_loss,
                        "loss_sq_mean": res.loss_sq_mean,
                        "duration_s": time.perf_counter() - t0,
                    }
                    ok = self._send_async(
                        sdk, base, payload, res.num_samples, meta, last, stop, doing
                    )
                    with lock:
                        counts["accepted" if ok else "dropped"] += 1
                    self._emit(
                        "upload",
                        {
                            "round": base + 1,
                            "client": shard.client_id,
                            "accepted": ok,
                            "data": payload,
                            "meta": meta,
                            "num_samples": res.num_samples,
                            "malicious": None,
                        },
                    )
            except BaseException as exc:  # noqa: BLE001 - reported by run_async
                errors.append(exc)
                stop.set()

        threads = [
            threading.Thread(target=client_loop, args=(i, shard), name=f"fl-async-{i}", daemon=True)
            for i, shard in enumerate(self.data.clients)
        ]
        t_start = time.perf_counter()
        for th in threads:
            th.start()
        reports: list[RoundReport] = []
        seen = start
        moved = time.monotonic()  # when the last new version was seen
        try:
            while seen < last and not errors:
                if time.monotonic() - moved > self.config.round_timeout:
                    raise TimeoutError(self._stalled(seen, last, doing))
                version = int(monitor.status()["version"])
                if version <= seen:
                    time.sleep(0.05)
                    continue
                moved = time.monotonic()
                glob = monitor.wait_for_version(version, timeout=self.config.round_timeout)
                acc, loss = self.evaluate_bytes(glob.data)
                seen = glob.version
                with lock:
                    accepted, dropped = counts["accepted"], counts["dropped"]
                report = RoundReport(
                    round=seen,
                    version=seen,
                    accuracy=acc,
                    loss=loss,
                    seconds=time.perf_counter() - t_start,
                    accepted=accepted,
                    late=dropped,
                    mean_train_seconds=0.0,
                    mean_upload_seconds=0.0,
                )
                log.info("version %d: accuracy %.3f at %.2fs", seen, acc, report.seconds)
                reports.append(report)
                self._emit("round", {**report.__dict__, "global_model": glob.data})
        finally:
            stop.set()
            for th in threads:
                th.join(self.config.round_timeout)
            monitor.close()
        if errors:
            raise errors[0]
        return reports

    def _client_for(self, client: str) -> FLClient:
        """The client's SDK connection, to the gateway it is assigned now (asked again each
        time with a dynamic assignment: placement may change between versions)."""
        if self._dynamic:
            try:
                return self._connect(client, self._resolve(client))
            except ClientNotSelected:  # no round open this instant: stay put
                pass
        return self.clients[client]

    def _moved(self, client: str, sdk: FLClient) -> bool:
        """Whether the client is placed on another node now than the one ``sdk`` reaches
        (then connected there); False while the assignment cannot be asked."""
        if not self._dynamic:
            return False
        try:
            return self._client_for(client) is not sdk
        except GatewayUnavailable as exc:  # asked again at the next check
            log.info("%s: its placement not known now (%s)", client, exc)
            return False

    def _stalled(self, seen: int, last: int, doing: Mapping[str, str]) -> str:
        """What an async job that published no version for ``round_timeout`` s looks like:
        each node's open round (what it accepted, its capacity, frozen or not) and what each
        client is doing (the 409 it was last refused with, if it waits after one)."""
        nodes: dict[str, Any] = {}
        for cid, url in self.gateway_of.items():
            if url in nodes:
                continue
            try:
                st = self.clients[cid].status()  # that client's connection to the node
                prog = st.get("progress") or {}
                nodes[url] = {
                    k: v
                    for k, v in {**st, **prog}.items()
                    if k in ("version", "round", "received", "accepted", "capacity", "frozen",
                             "plan_version", "done", "dropped")
                }  # fmt: skip
            except Exception as exc:  # noqa: BLE001 - a report, not a control path
                nodes[url] = f"status unreadable: {exc}"
        return (
            f"{self.job}: no new version for {self.config.round_timeout:.0f} s (version {seen} "
            f"of {last}); nodes: {json.dumps(nodes, sort_keys=True, default=str)}; clients: "
            f"{json.dumps(dict(sorted(doing.items())))}"
        )

    def _send_async(
        self,
        sdk: FLClient,
        base: int,
        payload: bytes,
        samples: int,
        meta: Mapping[str, float],
        last: int,
        stop: Any,
        doing: dict[str, str],
    ) -> bool:
        """Upload an update trained on version ``base`` until it counts (True) or is too
        stale, or the job is done (False); what it does is noted in ``doing``.

        Each try goes to the node the client is placed on now (:meth:`_client_for`). A round
        not open on the node yet (409 ``round_not_open`` once the SDK's own retries ran out:
        the round waits for the control plane's plan, or the node follows the root) opens
        with no new version, so the update is sent again at once. After any other 409 of
        :data:`ASYNC_RETRY` the client waits for a new version *or* for its placement to
        move, whichever comes first: the control plane plans each round's share of the
        buffer per node from that round's placement, so a node the client was placed on
        before it trained may have no share of the round its update lands in (409
        ``round_full``), and the version it would wait for there can only come from the
        clients placed on the other nodes. Waiting for a version after either refusal
        waited for good once every client did (issue 35)."""
        seen = base
        cid = sdk.client_id
        while not stop.is_set():
            self._moved(cid, sdk)  # connects it where the control plane places it now
            sdk = self.clients[cid]
            try:
                doing[cid] = f"uploads to round {base + 1}"
                sdk.upload(base + 1, payload, samples, meta=meta)
                return True
            except StaleRound as exc:
                then = (
                    "sends again"
                    if exc.error in NOT_OPEN_YET
                    else f"waits for a version after {seen} or another node"
                )
                doing[cid] = (
                    f"refused {exc.error} for round {base + 1} on {sdk.gateway_url}, {then}"
                )
                if exc.error not in ASYNC_RETRY:
                    log.info("%s: update on v%d dropped (%s)", cid, base, exc.error)
                    return False
                if exc.error in NOT_OPEN_YET:  # it opens with no new version: send again
                    if int(sdk.status()["version"]) >= last:
                        return False
                    continue
            version = int(sdk.status()["version"])  # send again once a new version is out
            polls = 0
            while version <= seen and not stop.is_set():
                time.sleep(ASYNC_POLL_S)
                polls += 1
                if polls % PLACEMENT_POLLS == 0 and self._moved(cid, sdk):
                    break  # placed on another node: send there now
                version = int(sdk.status()["version"])
            seen = max(seen, version)
            if version >= last:
                return False
        return False


#: seconds between an async client's status polls while it waits to send again
ASYNC_POLL_S = 0.05
#: an async client waiting to send again asks where it is placed every this many polls (the
#: control plane's assignment; about once a second)
PLACEMENT_POLLS = 20


#: 409s after which an async client sends the same update again: ``round_not_open`` at once
#: (:data:`NOT_OPEN_YET`), the others once the version or the client's placement moved
#: (``duplicate_client``: the open buffer holds its update on an older version already)
ASYNC_RETRY = frozenset(
    {"round_full", "stale_round", "round_closed", "round_not_open", "duplicate_client"}
)
#: 409s of :data:`ASYNC_RETRY` after which the round opens with no new version
NOT_OPEN_YET = frozenset({"round_not_open"})
