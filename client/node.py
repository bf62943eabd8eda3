"""The node gateway's client: one FL client's model reads and uploads (:class:`FLClient`)::

    client = FLClient("https://127.0.0.1:8081", "digits", "client-000", token,
                      ca_file=".state/secrets/tls/ca.crt")  # fedfaas up's CA
    model = client.fetch_model()                  # ETag-aware: 304 reuses the cached bytes
    client.upload(model.version + 1, state_dict, num_samples=120)

Which gateway a client talks to comes from the control plane (:meth:`client.job.Job.assignment`);
its bearer token from the job's enrollment (:meth:`client.job.Job.enroll`). Every refusal is a
typed :class:`~client.errors.ClientError` (:mod:`client.errors`).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np
from safetensors.numpy import save

from client.errors import GatewayUnavailable, StaleRound, raise_for, unreachable
from client.stream import SafetensorsBody, streamable
from client.tls import CaFile, verify_for

log = logging.getLogger(__name__)

CHUNK = 1 << 20
NOT_YET_OPEN = frozenset({"round_not_open"})
#: most retries of one upload or model read answered 503 with ``Retry-After`` (see
#: :meth:`FLClient.upload`, :meth:`FLClient.fetch_model`)
BUSY_RETRIES = 8


@dataclass
class _BusyWaits:
    """One call's waits on 503s with ``Retry-After`` (a node out of room, or one still
    fetching a model): each as long as asked, at most :data:`BUSY_RETRIES` of them and
    ``budget`` seconds in all."""

    budget: float
    waited: float = 0.0
    retries: int = 0

    def allows(self, wait: float) -> bool:
        """Whether the call may wait ``wait`` s more."""
        return self.retries < BUSY_RETRIES and self.waited + wait <= self.budget

    def wait(self, seconds: float) -> None:
        self.retries += 1
        time.sleep(seconds)
        self.waited += seconds


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


def update_bytes(update: Mapping[str, Any] | bytes | bytearray | memoryview) -> bytes:
    """An update as safetensors bytes: bytes as they are, a state dict of numpy arrays as
    ``safetensors.numpy.save`` makes them (:class:`~client.stream.SafetensorsBody`: a strided
    array as its values, a 0-d one keeping its shape; no torch needed), one of torch tensors
    through :func:`client.model.state_dict_to_bytes` (the ``[torch]`` extra)."""
    body = _body(update)
    return body if isinstance(body, bytes) else b"".join(body)


def _body(update: Mapping[str, Any] | bytes | bytearray | memoryview) -> bytes | SafetensorsBody:
    """What an upload sends: a state dict of numpy arrays as a :class:`SafetensorsBody`,
    written while it is sent; anything else as safetensors bytes made first."""
    if isinstance(update, bytes):
        return update
    if isinstance(update, bytearray | memoryview):
        return bytes(update)
    if streamable(update):
        return SafetensorsBody(update)
    if all(isinstance(v, np.ndarray) for v in update.values()):  # a dtype safetensors lacks
        return save(dict(update))  # its own error
    from client.model import state_dict_to_bytes

    return state_dict_to_bytes(update)


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
    ca_file : the platform's CA certificate, for an ``https://`` gateway (:mod:`client.tls`).
    tls_name : the name the gateway's certificate is verified against where it is not the
        URL's host: the control plane gives it with a gateway found through discovery
        (``https://POD_IP:PORT`` whose certificate names its node; the assignment's and
        ``/v1/nodes``' ``tls_name``). ``None``: the URL's host.
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
        ca_file: CaFile = None,
        tls_name: str | None = None,
    ) -> None:
        self.gateway_url = gateway_url.rstrip("/")
        #: sent as the TLS server name and checked against the certificate (httpcore's
        #: ``sni_hostname``), hostname checking on
        self._extensions = {"sni_hostname": tls_name} if tls_name else {}
        self.job = job
        self.client_id = client_id
        self._token = token
        self._http = httpx.Client(
            base_url=self.gateway_url,
            timeout=timeout,
            transport=transport,
            verify=verify_for(ca_file),
        )
        self._cached: GlobalModel | None = None

    def __enter__(self) -> FLClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _request(self, method: str, path: str, **kw: Any) -> httpx.Response:
        try:
            resp = self._http.request(method, path, extensions=self._extensions, **kw)
        except httpx.TransportError as exc:
            raise unreachable(self.gateway_url + path, exc, method) from exc
        raise_for(resp)
        return resp

    def status(self) -> dict[str, Any]:
        """``GET /v1/jobs/{job}``: round, version, rounds, goal, received, status."""
        headers = {"Authorization": f"Bearer {self._token}"}
        body: dict[str, Any] = self._request("GET", f"/v1/jobs/{self.job}", headers=headers).json()
        return body

    def fetch_model(self, *, busy_wait: float = 30.0) -> GlobalModel:
        """The current global model; sends ``If-None-Match`` and reuses the cache on 304.

        A 503 with ``Retry-After`` (a node that is still fetching the new version from its
        root node, or one that is busy) is asked again after the wait it asks for, at most
        ``BUSY_RETRIES`` times and ``busy_wait`` s in all (each wait logged); then, or for
        any other 5xx, :class:`GatewayUnavailable`."""
        headers = {"Authorization": f"Bearer {self._token}"}
        if self._cached is not None:
            headers["If-None-Match"] = self._cached.etag
        busy = _BusyWaits(busy_wait)
        while True:
            try:
                resp = self._request("GET", f"/v1/jobs/{self.job}/model", headers=headers)
                break
            except GatewayUnavailable as exc:
                wait = exc.retry_after
                if wait is None or not busy.allows(wait):
                    raise
                log.warning(
                    "%s: model read answered %s; asking again in %.1f s",
                    self.client_id,
                    exc.reason[:200],
                    wait,
                )
                busy.wait(wait)
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

        ``update`` is a state dict or safetensors bytes. A state dict of numpy arrays is
        written as safetensors while it is sent (:class:`~client.stream.SafetensorsBody`:
        the bytes ``safetensors.numpy.save`` makes of the same values, never whole in memory,
        the first sent at once); one of torch tensors is serialised first.
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
        data = _body(update)
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
        busy = _BusyWaits(busy_wait)  # the waits on 503s with Retry-After so far
        down_until: float | None = None  # the node is unreachable: retry until then
        while True:
            try:
                resp = self._request(
                    "POST",
                    f"/v1/jobs/{self.job}/rounds/{int(round)}/updates",
                    headers=headers,
                    content=_chunks(data) if isinstance(data, bytes) else iter(data),
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
                if not busy.allows(wait):
                    raise
                log.warning(
                    "%s: upload of round %d refused for now (%s); retry %d of %d in %.0f s",
                    self.client_id,
                    round,
                    exc.reason[:200],
                    busy.retries + 1,
                    BUSY_RETRIES,
                    wait,
                )
                busy.wait(wait)
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
    ca_file: CaFile = None,
) -> JobCreated:
    """``POST /v1/jobs``: create ``job`` with ``initial_weights`` (safetensors bytes).

    ``nodes`` (optional) names the node gateways the job spans, the root (this gateway) first.
    ``ca_file``: the platform's CA for an ``https://`` gateway (:mod:`client.tls`).
    """
    params = {"job": job, "rounds": str(rounds), "goal": str(goal), "clients": ",".join(clients)}
    if nodes:
        params["nodes"] = ",".join(nodes)
    url = gateway_url.rstrip("/") + "/v1/jobs"
    with httpx.Client(timeout=timeout, transport=transport, verify=verify_for(ca_file)) as http:
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
            raise unreachable(url, exc, "POST") from exc
    raise_for(resp)
    body = resp.json()
    return JobCreated(
        job=str(body["job"]),
        round=int(body["round"]),
        version=int(body["version"]),
        spec=dict(body.get("spec", {})),
        tokens={str(k): str(v) for k, v in body["tokens"].items()},
        plan=dict(body.get("plan") or {}),
    )
