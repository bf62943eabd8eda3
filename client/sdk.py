"""FL client SDK: talk to a FedFaaS node gateway over HTTP.

    client = FLClient("http://127.0.0.1:8081", "digits", "client-000", token)
    model = client.fetch_model()                  # ETag-aware: 304 reuses the cached bytes
    client.upload(model.version + 1, state_dict, num_samples=120)

A job is created on the control plane (:func:`submit_job`), which places each client on a
node gateway (``GET /v1/jobs/{job}/assignment``, see
:func:`client.simulator.control_plane_assignment`). Each client's bearer token comes in the
job's creation answer (``submit_job(...)["tokens"]``, or :attr:`JobCreated.tokens` from a
gateway): it depends on a salt drawn for that job, so it is good for that job only, and not
for a job created later under the same name.

Every 4xx answer from the gateway becomes an :class:`UpdateRejected` (or a subclass) carrying
the server's JSON ``{"error", "detail"}``; transport failures and 5xx become
:class:`GatewayUnavailable`.
"""

from __future__ import annotations

import base64
import json
import logging
import struct
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

log = logging.getLogger(__name__)

CHUNK = 1 << 20
NOT_YET_OPEN = frozenset({"round_not_open"})
#: most retries of one upload answered 503 with ``Retry-After`` (see :meth:`FLClient.upload`)
BUSY_RETRIES = 8


class ClientError(Exception):
    """Base class of every error the SDK raises."""


class GatewayUnavailable(ClientError):
    """The gateway could not be reached, or answered with a 5xx; ``retry_after`` is the wait
    in seconds a 503 asked for (its ``Retry-After``), else None."""

    def __init__(self, url: str, reason: str, *, retry_after: float | None = None) -> None:
        super().__init__(f"gateway {url} unavailable: {reason}")
        self.url = url
        self.reason = reason
        self.retry_after = retry_after


class UpdateRejected(ClientError):
    """The gateway answered a 4xx; ``error`` and ``detail`` are the server's JSON fields."""

    def __init__(self, status: int, error: str, detail: str, *, method: str, url: str) -> None:
        super().__init__(f"{method} {url} -> {status} {error}: {detail}")
        self.status = status
        self.error = error
        self.detail = detail
        self.method = method
        self.url = url


class StaleRound(UpdateRejected):
    """409: the round is not the job's current round (stale or future)."""


class Unauthorized(UpdateRejected):
    """401/403: missing or wrong token."""


class JobNotFound(UpdateRejected):
    """404: the gateway does not know the job."""


class JobFailed(ClientError):
    """The control plane failed the job (a round short of its minimum at its deadline, or no
    model after it closed); ``reason`` is the control plane's ``failed``."""

    def __init__(self, job: str, reason: str) -> None:
        super().__init__(f"job {job!r} failed: {reason}")
        self.job = job
        self.reason = reason


@dataclass(frozen=True)
class GlobalModel:
    """A global model as served by the gateway."""

    version: int
    etag: str
    data: bytes = field(repr=False)
    changed: bool  # False when the gateway answered 304 and the cached copy was returned


@dataclass(frozen=True)
class UploadReceipt:
    """A 202: the update is sealed and journaled on the node. ``resent``: an earlier attempt's
    answer was lost (the connection broke) and the node said it holds this client's update of
    the round already (409 ``duplicate_client``); ``key`` is then empty."""

    key: str
    round: int
    client: str
    seconds: float
    resent: bool = False


@dataclass(frozen=True)
class JobCreated:
    job: str
    round: int
    version: int
    spec: dict[str, Any]
    tokens: dict[str, str]
    plan: dict[str, Any] = field(default_factory=dict)  # slots and client_nodes, when given

    def client_nodes(self) -> dict[str, str]:
        """Client id -> node name from the job's plan (empty when the gateway gave none)."""
        return {str(k): str(v) for k, v in dict(self.plan.get("client_nodes") or {}).items()}


def _raise_for(resp: httpx.Response, method: str) -> None:
    """Turn a non-2xx/304 answer into the matching typed error."""
    if resp.status_code < 400:
        return
    url = str(resp.request.url) if resp.request is not None else "?"
    if resp.status_code >= 500:
        raw = resp.headers.get("Retry-After", "") if resp.status_code == 503 else ""
        raise GatewayUnavailable(
            url,
            f"HTTP {resp.status_code}: {resp.text[:200]}",
            retry_after=float(raw) if raw.isdigit() else None,
        )
    error, detail = f"http_{resp.status_code}", resp.text[:500]
    try:
        body = resp.json()
        if isinstance(body, dict):
            error = str(body.get("error", error))
            detail = str(body.get("detail", detail))
    except ValueError:
        pass
    cls: type[UpdateRejected] = UpdateRejected
    if resp.status_code == 409:
        cls = StaleRound
    elif resp.status_code in (401, 403):
        cls = Unauthorized
    elif resp.status_code == 404:
        cls = JobNotFound
    raise cls(resp.status_code, error, detail, method=method, url=url)


def _chunks(data: bytes | memoryview, size: int = CHUNK) -> Iterator[bytes]:
    view = memoryview(data)
    for start in range(0, len(view), size):
        yield bytes(view[start : start + size])


def _version_of(resp: httpx.Response) -> int:
    raw = resp.headers.get("X-Model-Version")
    if raw is None:
        etag = resp.headers.get("ETag", "").strip('"')
        raw = etag[1:] if etag.startswith("v") else etag
    return int(raw)


class FLClient:
    """One FL client's connection to its node gateway.

    Parameters
    ----------
    gateway_url : base URL of the node gateway, e.g. ``http://127.0.0.1:8081``.
    job : job name.
    client_id : this client's id (sent as ``X-Client-Id``).
    token : this client's bearer token (from the job's creation answer: ``tokens``).
    timeout : seconds for connect/read of each request.
    transport : optional httpx transport (tests).
    """

    def __init__(
        self,
        gateway_url: str,
        job: str,
        client_id: str,
        token: str,
        *,
        timeout: float = 60.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.gateway_url = gateway_url.rstrip("/")
        self.job = job
        self.client_id = client_id
        self._token = token
        self._http = httpx.Client(base_url=self.gateway_url, timeout=timeout, transport=transport)
        self._cached: GlobalModel | None = None

    def __enter__(self) -> FLClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _request(self, method: str, path: str, **kw: Any) -> httpx.Response:
        try:
            resp = self._http.request(method, path, **kw)
        except httpx.TransportError as exc:
            raise GatewayUnavailable(self.gateway_url, repr(exc)) from exc
        _raise_for(resp, method)
        return resp

    def status(self) -> dict[str, Any]:
        """``GET /v1/jobs/{job}``: round, version, rounds, goal, received, status."""
        headers = {"Authorization": f"Bearer {self._token}"}
        body: dict[str, Any] = self._request("GET", f"/v1/jobs/{self.job}", headers=headers).json()
        return body

    def fetch_model(self) -> GlobalModel:
        """The current global model; sends ``If-None-Match`` and reuses the cache on 304."""
        headers = {"Authorization": f"Bearer {self._token}"}
        if self._cached is not None:
            headers["If-None-Match"] = self._cached.etag
        resp = self._request("GET", f"/v1/jobs/{self.job}/model", headers=headers)
        if resp.status_code == 304 and self._cached is not None:
            self._cached = GlobalModel(
                self._cached.version, self._cached.etag, self._cached.data, changed=False
            )
            return self._cached
        version = _version_of(resp)
        etag = resp.headers.get("ETag", f'"v{version}"')
        self._cached = GlobalModel(version, etag, resp.content, changed=True)
        return self._cached

    def wait_for_version(
        self, min_version: int, timeout: float = 120.0, poll: float = 0.05
    ) -> GlobalModel:
        """Wait until the gateway serves model version ``min_version`` or newer, then fetch it.

        Polls the small ``GET /v1/jobs/{job}`` status (not the model) until the version is
        there, so a node that follows a root node is asked for the model only once it has
        caught up.
        """
        deadline = time.monotonic() + timeout
        delay = poll
        while True:
            version = int(self.status()["version"])
            if version >= min_version:
                model = self.fetch_model()
                if model.version >= min_version:
                    return model
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"{self.job}: model version {version} < {min_version} after {timeout}s"
                )
            time.sleep(delay)
            delay = min(delay * 1.5, 0.5)

    def upload(
        self,
        round: int,
        update: Mapping[str, Any] | bytes,
        num_samples: int,
        *,
        meta: Mapping[str, float] | None = None,
        not_open_wait: float = 30.0,
        busy_wait: float = 60.0,
        unavailable_wait: float = 30.0,
    ) -> UploadReceipt:
        """Upload this client's full local weights for ``round``.

        ``update`` is a state dict (serialised to safetensors here) or safetensors bytes.
        ``meta`` is this client's metadata for the round, finite numbers under lowercase
        names (at most 16, 1 KiB as JSON), e.g. ``{"loss": 0.41, "duration_s": 2.3}``: sent as
        the ``X-Client-Meta`` header, kept by the gateway with the update and written to the
        round's ``meta.json`` beside ``n_samples``, where FLStore's workloads read it (Oort
        uses ``loss``, ``loss_sq_mean`` and ``duration_s``).
        The body is streamed in 1 MiB chunks with an exact ``Content-Length``. A 409 saying
        the round is not open on this node *yet* is retried for up to ``not_open_wait`` s.
        Raises :class:`StaleRound` on other 409s and :class:`UpdateRejected` on other 4xx
        (400 ``bad_client_meta`` for metadata the gateway refuses); ``ValueError`` for a
        ``meta`` value that is not a finite number.
        A 503 with ``Retry-After`` (the node holds as many bodies or objects as it can just
        now) is retried after the wait it asks for, at most ``BUSY_RETRIES`` times and
        ``busy_wait`` s in all (each wait logged); then, or for any other 5xx,
        :class:`GatewayUnavailable`.
        A broken connection, a refused one or a 5xx without ``Retry-After`` (a gateway that
        restarts) is retried for up to ``unavailable_wait`` s (0: never). A retry the node
        answers 409 ``duplicate_client`` means an earlier attempt landed and only its answer
        was lost: the receipt then says ``resent``. The update counts once either way.
        """
        if isinstance(update, bytes | bytearray | memoryview):
            data = bytes(update) if not isinstance(update, bytes) else update
        else:
            from client.model import state_dict_to_bytes

            data = state_dict_to_bytes(update)
        headers = {
            "Authorization": f"Bearer {self._token}",
            "X-Client-Id": self.client_id,
            "X-Sample-Count": str(int(num_samples)),
            "Content-Length": str(len(data)),
            "Content-Type": "application/octet-stream",
        }
        if meta is not None:
            headers["X-Client-Meta"] = json.dumps(
                {str(k): v for k, v in meta.items()}, separators=(",", ":"), allow_nan=False
            )
        t0 = time.perf_counter()
        deadline = time.monotonic() + not_open_wait
        delay = 0.05
        busy, retries = 0.0, 0  # seconds waited on 503s so far, and how often
        down_until: float | None = None  # the node is unreachable: retry until then
        while True:
            try:
                resp = self._request(
                    "POST",
                    f"/v1/jobs/{self.job}/rounds/{int(round)}/updates",
                    headers=headers,
                    content=_chunks(data),
                )
                break
            except StaleRound as exc:
                if exc.error == "duplicate_client" and down_until is not None:
                    log.info(
                        "%s: round %d upload had landed before the break", self.client_id, round
                    )
                    return UploadReceipt(
                        "", int(round), self.client_id, time.perf_counter() - t0, True
                    )
                # The node has not opened the round yet (it follows the root node's
                # publication); anything else (stale, future, full, duplicate) is final.
                if exc.error not in NOT_YET_OPEN or time.monotonic() + delay > deadline:
                    raise
                time.sleep(delay)
                delay = min(delay * 2, 1.0)
            except GatewayUnavailable as exc:
                wait = exc.retry_after
                if wait is None:
                    now = time.monotonic()
                    down_until = now + unavailable_wait if down_until is None else down_until
                    if now + delay > down_until:
                        raise
                    log.warning("%s: %s; retrying", self.client_id, exc.reason[:200])
                    time.sleep(delay)
                    delay = min(delay * 2, 1.0)
                    continue
                if retries >= BUSY_RETRIES or busy + wait > busy_wait:
                    raise
                retries += 1
                log.warning(
                    "%s: upload of round %d refused for now (%s); retry %d of %d in %.0f s",
                    self.client_id,
                    round,
                    exc.reason[:200],
                    retries,
                    BUSY_RETRIES,
                    wait,
                )
                time.sleep(wait)
                busy += wait
        body = resp.json()
        log.debug("%s uploaded round %d (%d bytes)", self.client_id, round, len(data))
        return UploadReceipt(
            key=str(body.get("key", "")),
            round=int(body.get("round", round)),
            client=str(body.get("client", self.client_id)),
            seconds=time.perf_counter() - t0,
        )


def create_job(
    gateway_url: str,
    admin_token: str,
    job: str,
    initial_weights: bytes,
    *,
    rounds: int,
    goal: int,
    clients: list[str],
    nodes: list[str] | None = None,
    timeout: float = 60.0,
    transport: httpx.BaseTransport | None = None,
) -> JobCreated:
    """``POST /v1/jobs``: create ``job`` with ``initial_weights`` (safetensors bytes).

    ``nodes`` (optional) names the node gateways the job spans, the root (this gateway) first.
    """
    params = {"job": job, "rounds": str(rounds), "goal": str(goal), "clients": ",".join(clients)}
    if nodes:
        params["nodes"] = ",".join(nodes)
    url = gateway_url.rstrip("/") + "/v1/jobs"
    with httpx.Client(timeout=timeout, transport=transport) as http:
        try:
            resp = http.post(
                url,
                params=params,
                content=initial_weights,
                headers={
                    "Authorization": f"Bearer {admin_token}",
                    "Content-Type": "application/octet-stream",
                },
            )
        except httpx.TransportError as exc:
            raise GatewayUnavailable(gateway_url, repr(exc)) from exc
    _raise_for(resp, "POST")
    body = resp.json()
    return JobCreated(
        job=str(body["job"]),
        round=int(body["round"]),
        version=int(body["version"]),
        spec=dict(body.get("spec", {})),
        tokens={str(k): str(v) for k, v in body["tokens"].items()},
        plan=dict(body.get("plan") or {}),
    )


#: The safetensors ``__metadata__`` entry through which a job declares its evaluator.
EVALUATOR_KEY = "fedfaas.evaluator"
#: ... and its server optimizer (``fedfaas.server_opt.METADATA_KEY``).
SERVER_OPT_KEY = "fedfaas.server_opt"
#: ... and async mode (``fedfaas.fedbuff.METADATA_KEY``).
ASYNC_KEY = "fedfaas.async"
#: ... and its aggregation rule (``fedfaas.robust.METADATA_KEY``).
AGGREGATION_KEY = "fedfaas.aggregation"


def with_metadata(weights: bytes, metadata: Mapping[str, str]) -> bytes:
    """``weights`` (safetensors bytes) with ``metadata`` added to its ``__metadata__`` map.

    Only the header changes (padded with spaces to 8 bytes, as safetensors writes it); the
    tensor data is untouched.
    """
    (n,) = struct.unpack_from("<Q", weights, 0)
    header = json.loads(weights[8 : 8 + n])
    header["__metadata__"] = {**(header.get("__metadata__") or {}), **dict(metadata)}
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw + bytes(weights[8 + n :])


def submit_job(
    control_plane_url: str,
    job: str,
    initial_weights: bytes,
    *,
    rounds: int,
    admin_token: str,
    clients: list[str] | None = None,
    goal: int | None = None,
    policy: str = "leastconn",
    per_leaf: int = 2,
    overprovision: float = 1.0,
    deadline_s: float = 600.0,
    min_updates: int = 1,
    on_shortfall: str = "reopen",
    max_reopens: int = 1,
    selection: str = "random",
    evaluator: Mapping[str, Any] | None = None,
    server_opt: Mapping[str, Any] | None = None,
    fedbuff: Mapping[str, Any] | None = None,
    aggregation: Mapping[str, Any] | None = None,
    drop_flagged: Mapping[str, Any] | None = None,
    timeout: float = 120.0,
    transport: httpx.BaseTransport | None = None,
) -> dict[str, Any]:
    """Create ``job`` on the control plane (``POST /v1/jobs``), which creates it on the node
    gateways, places the clients and opens round 1.

    Parameters
    ----------
    control_plane_url : e.g. ``http://127.0.0.1:8070``.
    job : job name (``[a-z0-9][a-z0-9-]{0,39}``).
    initial_weights : the model's initial weights as safetensors bytes.
    rounds : number of rounds.
    clients : clients enrolled at creation; each uploads with its token from the answer's
        ``tokens``. Others enroll later with the answer's ``enrollment_token`` (:func:`enroll`);
        round 1 opens once ``goal`` clients are enrolled.
    admin_token : the control plane's admin token (the gateways' admin secret, read from its
        file, e.g. ``.state/secrets/gateway-admin-secret``).
    goal : updates that close a round (default: every client enrolled at creation).
    policy : placement, ``"leastconn"`` (spread over the nodes) or ``"bestfit"`` (pack).
    per_leaf : updates per leaf aggregator.
    overprovision : clients selected per round / goal.
    deadline_s : seconds a round may take. At its deadline a round closes with what arrived
        if at least ``min_updates`` came; else it gets another deadline
        (``on_shortfall="reopen"``, at most ``max_reopens`` times) or the job fails
        (``"fail"``; the job's view then says why in ``failed``).
    selection : how each round's clients are chosen: ``"random"``, or ``"oort"``: from round
        2 on, the control plane asks FLStore's request tracker for Oort's selection (utility
        from the clients' ``loss`` and ``n_samples``, speed from their ``duration_s``, in the
        ``meta`` of their uploads; unseen clients are explored). When the tracker cannot
        answer, the round is random and its ``selection_note`` in the job's view says why.
    evaluator : the job's validation-set evaluator for FLStore's contribution workloads
        (Shapley, leave-one-out), e.g. ``{"kind": "digits-softmax", "split_seed": 0}`` (see
        ``cache_engine.evaluators``); it travels in the weights' safetensors metadata
        (``fedfaas.evaluator``) and the gateways write it into every round's ``meta.json``.
    server_opt : the server optimizer the root applies to each round's FedAvg, e.g.
        ``{"name": "fedadam", "eta": 0.01}``: ``fedavgm`` (``eta``, ``momentum``),
        ``fedadam`` / ``fedyogi`` (``eta``, ``beta_1``, ``beta_2``, ``tau``), ``fedadagrad``
        (``eta``, ``tau``); unnamed ones take Flower's defaults (``fedfaas.server_opt``). It
        travels in the weights' safetensors metadata (``fedfaas.server_opt``); its state is
        checkpointed beside each round's model.
    fedbuff : run the job asynchronously (FedBuff; ``{}`` takes the defaults): a round is a
        buffer of ``goal`` updates, each trained on any of the last ``max_staleness + 1``
        versions (default 4) and weighted by its staleness (``staleness``: ``"poly"``
        ``(1+s)^-a``, a = 0.5; ``"hinge"`` with ``a``, ``b``; ``"constant"``); a full buffer
        moves the model by ``eta`` (default 1) times its weighted mean delta
        (``fedfaas.fedbuff``). The clients selected per round (``overprovision``) are the
        ones training at once. Not with ``server_opt``.
    aggregation : a rule against poisoned updates instead of FedAvg (``fedfaas.robust``):
        ``{"rule": "median"}``, ``{"rule": "trimmed-mean", "beta": 0.1}``,
        ``{"rule": "krum", "f": 2}``, ``{"rule": "multi-krum", "f": 2, "m": 6}`` or
        ``{"rule": "fltrust", "root_client": "server"}`` (that client's update, trained on the
        job owner's clean root data, is the trusted reference); ``"shards": S`` sets the
        number of coordinate shards (default: one per aggregator endpoint). The root gateway
        runs it on the round's updates in its shared memory; the job stays on that node. Not
        with ``fedbuff``. Each round's ``meta.json`` records the decision. Central
        differential privacy is the rule ``{"rule": "dp-fedavg", "clip": C,
        "noise_multiplier": z, "delta": 1e-5, "epsilon": budget}`` (DP-FedAvg: each delta
        clipped to norm ``C``, noise of std ``z C`` on their sum, divided by ``goal``); the
        control plane accounts the epsilon spent and ends the job before a round that would
        pass ``epsilon`` (the job's ``privacy`` and ``stopped``).
    drop_flagged : the debugging loop: ``{"workload": "multi-krum", "params": {"f": 1}}``
        (or ``"cosine-to-aggregate"``) has the control plane ask FLStore, after each round,
        which clients that workload flags, and drop them from every later round before
        aggregation (their uploads are refused; each round's ``meta.json`` names them under
        ``excluded``). Needs the request tracker (``fedfaas up --with all`` wires it).

    Returns
    -------
    dict
        The control plane's view of the job (``job``, ``round``, ...) and ``tokens``: client
        id -> its bearer token (for :class:`FLClient` and the control plane's assignment).

    Raises
    ------
    UpdateRejected
        The control plane refused the job (4xx, with its ``error`` and ``detail``).
    GatewayUnavailable
        The control plane could not be reached, or answered with a 5xx.
    """
    clients = list(clients or [])
    if goal is None and not clients:
        raise ValueError("a job created without clients needs its goal")
    if evaluator is not None:
        spec = json.dumps(dict(evaluator), separators=(",", ":"), sort_keys=True)
        initial_weights = with_metadata(initial_weights, {EVALUATOR_KEY: spec})
    if server_opt is not None:
        spec = json.dumps(dict(server_opt), separators=(",", ":"), sort_keys=True)
        initial_weights = with_metadata(initial_weights, {SERVER_OPT_KEY: spec})
    if fedbuff is not None:
        spec = json.dumps(dict(fedbuff), separators=(",", ":"), sort_keys=True)
        initial_weights = with_metadata(initial_weights, {ASYNC_KEY: spec})
    if aggregation is not None:
        spec = json.dumps(dict(aggregation), separators=(",", ":"), sort_keys=True)
        initial_weights = with_metadata(initial_weights, {AGGREGATION_KEY: spec})
    body = {
        "job": job,
        "rounds": rounds,
        "goal": len(clients) if goal is None else goal,
        "clients": clients,
        "policy": policy,
        "per_leaf": per_leaf,
        "overprovision": overprovision,
        "deadline_s": deadline_s,
        "min_updates": min_updates,
        "on_shortfall": on_shortfall,
        "max_reopens": max_reopens,
        "selection": selection,
        "weights_b64": base64.b64encode(initial_weights).decode(),
    }
    if drop_flagged is not None:
        body["drop_flagged"] = dict(drop_flagged)
    resp = _control_plane(
        "POST", control_plane_url, "/v1/jobs", admin_token, timeout, transport, json=body
    )
    out: dict[str, Any] = resp.json()
    return out


def enroll(
    control_plane_url: str,
    job: str,
    clients: list[str],
    token: str,
    *,
    timeout: float = 60.0,
    transport: httpx.BaseTransport | None = None,
) -> dict[str, str]:
    """Enroll ``clients`` in ``job`` (``POST /v1/jobs/{job}/clients``) with the job's
    enrollment token (``submit_job``'s answer, handed out by the job's owner) or the admin
    token; returns each client's bearer token. Enrolling again returns the same token."""
    resp = _control_plane(
        "POST",
        control_plane_url,
        f"/v1/jobs/{job}/clients",
        token,
        timeout,
        transport,
        json={"clients": clients},
    )
    return {str(k): str(v) for k, v in resp.json()["tokens"].items()}


def leave(
    control_plane_url: str,
    job: str,
    client_id: str,
    token: str,
    *,
    timeout: float = 60.0,
    transport: httpx.BaseTransport | None = None,
) -> None:
    """Take ``client_id`` out of ``job`` with its own token: it is never selected again and
    its token is refused from then on (it cannot enroll again)."""
    _control_plane(
        "DELETE",
        control_plane_url,
        f"/v1/jobs/{job}/clients/{client_id}",
        token,
        timeout,
        transport,
        params={"client": client_id},
    )


def _control_plane(
    method: str,
    base_url: str,
    path: str,
    token: str,
    timeout: float,
    transport: httpx.BaseTransport | None,
    **kw: Any,
) -> httpx.Response:
    """One call of the control plane with ``token``; its errors raised as the SDK's."""
    with httpx.Client(timeout=timeout, transport=transport) as http:
        try:
            resp = http.request(
                method,
                base_url.rstrip("/") + path,
                headers={"Authorization": f"Bearer {token}"},
                **kw,
            )
        except httpx.TransportError as exc:
            raise GatewayUnavailable(base_url, repr(exc)) from exc
    _raise_for(resp, method)
    return resp


#: Tracker errors that mean "the cache engine has not ingested that round yet".
NOT_INGESTED = frozenset({"round_not_written", "unknown_job"})


class QueryFailed(ClientError):
    """FLStore's request tracker answered a query with an error (its ``error``/``detail``)."""

    def __init__(self, status: int, error: str, detail: str, query: Mapping[str, Any]) -> None:
        super().__init__(f"{query.get('workload')} query -> {status} {error}: {detail}")
        self.status = status
        self.error = error
        self.detail = detail
        self.query = dict(query)


def flstore_query(
    tracker_url: str,
    workload: str,
    job: str,
    *,
    rounds: list[int] | None = None,
    clients: list[str] | None = None,
    params: Mapping[str, Any] | None = None,
    token: str,
    wait: float = 120.0,
    transport: httpx.BaseTransport | None = None,
) -> dict[str, Any]:
    """Ask FLStore a question about ``job``: ``POST {tracker}/v1/queries?wait=true``.

    ``token`` is the tracker's analyst (or admin) token, read from its file (the platform
    writes ``.state/secrets/flstore-analyst-token``).

    ``workload`` is one of ``fedfaas.workloads`` (``multi-krum``, ``shapley``, ``oort``, ...),
    with its ``params``; ``rounds``/``clients`` fill the workload's round/client parameters.
    A round the cache engine has not ingested yet (the gateways checkpoint a round and tell
    the engine just after publishing it), and a tracker or engine that is restarting (a
    refused or broken connection, 502/503/504), are asked again for up to ``wait`` seconds;
    a query only reads, so asking again is safe.

    Returns
    -------
    dict
        The finished query: ``result`` (the workload's answer), ``latency_s``, ``hit``,
        ``function`` (the cache function that answered), ...

    Raises
    ------
    QueryFailed
        The tracker refused or failed the query.
    """
    query: dict[str, Any] = {"workload": workload, "job": job, "params": dict(params or {})}
    if rounds is not None:
        query["rounds"] = list(rounds)
    if clients is not None:
        query["clients"] = list(clients)
    url = tracker_url.rstrip("/") + "/v1/queries"
    deadline = time.monotonic() + wait
    with httpx.Client(timeout=max(wait, 30.0), transport=transport) as http:
        while True:
            try:
                resp = http.post(
                    url,
                    params={"wait": "true"},
                    json=query,
                    headers={"Authorization": f"Bearer {token}"},
                )
            except httpx.TransportError as exc:
                if time.monotonic() > deadline:
                    raise QueryFailed(0, "unreachable", repr(exc), query) from exc
                time.sleep(0.5)  # a tracker restarting: queries only read, so ask again
                continue
            if resp.status_code == 200:
                out: dict[str, Any] = resp.json()
                return out
            try:
                body = resp.json()
            except ValueError:
                body = {}
            body = body if isinstance(body, dict) else {}
            error = str(body.get("error", f"http_{resp.status_code}"))
            again = error in NOT_INGESTED or resp.status_code in (502, 503, 504)
            if not again or time.monotonic() > deadline:
                detail = str(body.get("detail", resp.text[:300]))
                raise QueryFailed(resp.status_code, error, detail, query)
            time.sleep(0.25)
