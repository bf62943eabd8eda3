"""Run an existing Flower ``NumPyClient`` against a FedFaaS job, unchanged.

A Flower user keeps their client class and changes the launch line::

    # Flower
    fl.client.start_client(server_address="127.0.0.1:8080", client=FlowerClient().to_client())
    # FedFaaS
    from client.flower import flower_weights, run_numpy_client
    run_numpy_client(FlowerClient(), "https://127.0.0.1:8070", "my-job", "client-7", token,
                     ca_file=".state/secrets/tls/ca.crt")  # fedfaas up's CA (TLS by default)

The adapter speaks only to what a ``NumPyClient`` defines (``get_parameters(config)``,
``fit(parameters, config)`` and ``evaluate(parameters, config)``, parameters being a list of
numpy arrays), so it needs no Flower import. Each round it asks the control plane whether the
client is in the round and where to upload (``GET /v1/jobs/{job}/assignment``), fetches the
global model from that gateway, calls ``evaluate`` on it (its loss goes with the update as the
client's ``loss`` metadata, which FLStore's Oort reads) and then ``fit``, and uploads the fitted
arrays with their example count, which is the FedAvg weight, as in Flower's FedAvg.

When ``evaluate`` or ``fit`` raises, the adapter tells the control plane that the client leaves
the round (``POST /v1/jobs/{job}/rounds/{round}/failures``): the round goes on with the other
clients under the job's ``min_updates``, as Flower's server goes on within
``accept_failures``, and closes once their updates are in instead of at its deadline. The
exception comes back to the caller in that round's :attr:`FlowerRound.error`; the client takes
part in the job's later rounds.

The job's model is the list of arrays, stored as safetensors tensors named by their index
(:func:`flower_weights`; create the job with ``flower_weights(client.get_parameters({}))``).
Flower's ``config`` dict carries ``server_round`` (the FedFaaS round number) and whatever
``config_fn(round)`` adds.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx
import numpy as np
from numpy.typing import NDArray
from safetensors.numpy import load, save

from client.control import report_failure
from client.errors import (
    ClientError,
    ClientNotSelected,
    GatewayUnavailable,
    JobFailed,
    from_response,
    raise_for,
)
from client.node import FLClient
from client.tls import CaFile, verify_for

log = logging.getLogger(__name__)

Config = dict[str, bool | bytes | float | int | str]


class NumPyClientLike(Protocol):
    """What the adapter calls: the methods of Flower's ``flwr.client.NumPyClient``."""

    def fit(
        self, parameters: list[NDArray[Any]], config: Config
    ) -> tuple[list[NDArray[Any]], int, dict[str, Any]]: ...

    def evaluate(
        self, parameters: list[NDArray[Any]], config: Config
    ) -> tuple[float, int, dict[str, Any]]: ...


def flower_weights(arrays: Sequence[NDArray[Any]]) -> bytes:
    """A Flower parameter list as safetensors bytes, tensor ``i`` named ``"{i:05d}"``."""
    if not arrays:
        raise ValueError("a Flower model needs at least one array")
    return save({f"{i:05d}": np.ascontiguousarray(a) for i, a in enumerate(arrays)})


def flower_arrays(weights: bytes) -> list[NDArray[Any]]:
    """The parameter list of safetensors bytes written by :func:`flower_weights`."""
    tensors = load(weights)
    names = [f"{i:05d}" for i in range(len(tensors))]
    if sorted(tensors) != names:
        raise ValueError(
            "the job's model is not a Flower parameter list (tensors named 00000, 00001, ...): "
            "create the job with flower_weights(client.get_parameters({}))"
        )
    return [tensors[n] for n in names]


@dataclass
class FlowerRound:
    """What one round did on this client."""

    round: int
    gateway_url: str
    #: ``evaluate`` on the global model the round started from: loss, examples, metrics
    loss: float | None
    eval_examples: int
    eval_metrics: dict[str, Any]
    #: ``fit``: examples (the update's FedAvg weight) and metrics
    fit_examples: int
    fit_metrics: dict[str, Any]
    fit_seconds: float
    #: the update's ``X-Client-Meta``: ``duration_s`` of ``fit`` and the ``loss`` evaluated
    meta: dict[str, float] = field(default_factory=dict)
    #: times the update was sent again to another node after its root node died
    resent: int = 0
    weights: bytes = field(default=b"", repr=False)
    #: what ``evaluate`` or ``fit`` raised: the client left the round without an update (the
    #: control plane was told, and the round went on without it); None when it trained
    error: BaseException | None = None


def run_numpy_client(
    client: NumPyClientLike,
    control_plane_url: str,
    job: str,
    client_id: str,
    token: str,
    *,
    config_fn: Callable[[int], Mapping[str, Any]] | None = None,
    evaluate: bool = True,
    timeout: float = 600.0,
    poll: float = 0.1,
    ca_file: CaFile = None,
) -> list[FlowerRound]:
    """Take part in ``job`` as ``client_id`` until the job is done; returns the rounds this
    client was in (a round it was not selected for is waited out).

    A round whose ``evaluate`` or ``fit`` raised is returned with the exception in its
    ``error``: the adapter told the control plane that the client leaves that round, which
    goes on with the other clients under the job's ``min_updates`` (as Flower's
    ``accept_failures``) instead of waiting for its deadline; this client goes on with the
    job's later rounds.

    ``ca_file`` is the platform's CA certificate, for ``https://`` URLs (:mod:`client.tls`):
    the control plane's and the gateways' it names.

    Raises :class:`~client.errors.JobFailed` when the job fails, :class:`TimeoutError` when
    no round opens for this client within ``timeout`` seconds, and the SDK's errors
    (:mod:`client.errors`) for refusals.
    """
    cp = _ControlPlane(control_plane_url, job, client_id, token, ca_file=ca_file)
    done: list[FlowerRound] = []
    last = 0  # the last round this client uploaded for
    deadline = time.monotonic() + timeout
    try:
        while True:
            view = cp.job_view()
            cur = view.get("round") or {}
            number = int(cur.get("number") or 0)
            if view.get("done"):
                return done
            a = cp.assignment() if number > last and cur.get("state") == "open" else None
            if a is None:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{job}: no round for {client_id} after {timeout:.0f} s")
                time.sleep(poll)
                continue
            rnd = int(a["round"])
            r = _train_round(cp, client, a, token, config_fn, evaluate)
            done.append(r)
            last = rnd
            if r.error is None:
                r.resent = _follow_resends(cp, r, int(a.get("resend") or 0), token)
            else:
                _leave_round(cp, r, token)
            deadline = time.monotonic() + timeout
    finally:
        cp.close()


def _train_round(
    cp: _ControlPlane,
    client: NumPyClientLike,
    a: Mapping[str, Any],
    token: str,
    config_fn: Callable[[int], Mapping[str, Any]] | None,
    evaluate: bool,
) -> FlowerRound:
    """Fetch the round's model, evaluate and fit on it, upload the fit. What the client's own
    code raises is the round's ``error`` (nothing uploaded); the SDK's errors propagate."""
    rnd, client_id = int(a["round"]), cp.client_id
    config: Config = {"server_round": rnd, **(config_fn(rnd) if config_fn else {})}
    with cp.gateway(str(a["gateway_url"]), token, a.get("tls_name") or None) as fl:
        model = fl.wait_for_version(rnd - 1)
        t0 = time.perf_counter()
        try:
            r = _fit(client, flower_arrays(model.data), config, evaluate)
        except Exception as exc:  # noqa: BLE001 - the client's training failed: it leaves
            log.warning("%s: round %d: training raised %r; leaving the round", client_id, rnd, exc)
            return FlowerRound(
                rnd, str(a["gateway_url"]), None, 0, {}, 0, {}, time.perf_counter() - t0, error=exc
            )
        r.round, r.gateway_url = rnd, str(a["gateway_url"])
        fl.upload(rnd, r.weights, r.fit_examples, meta=r.meta)
    log.info(
        "%s: round %d fitted on %d examples (loss before %s)",
        client_id,
        rnd,
        r.fit_examples,
        r.loss,
    )
    return r


def _fit(
    client: NumPyClientLike, params: list[NDArray[Any]], config: Config, evaluate: bool
) -> FlowerRound:
    """The client's ``evaluate`` then ``fit`` on ``params``: the round's update, not sent."""
    loss, n_eval, eval_metrics = (
        client.evaluate(params, dict(config)) if evaluate else (None, 0, {})
    )
    t0 = time.perf_counter()
    fitted, n_fit, fit_metrics = client.fit(params, dict(config))
    seconds = time.perf_counter() - t0
    if n_fit < 1:
        raise ValueError(f"fit() reported {n_fit} examples: the FedAvg weight must be >= 1")
    return FlowerRound(
        0,
        "",
        None if loss is None else float(loss),
        int(n_eval),
        dict(eval_metrics),
        int(n_fit),
        dict(fit_metrics),
        seconds,
        meta={"duration_s": seconds} | ({} if loss is None else {"loss": float(loss)}),
        weights=flower_weights(fitted),
    )


def _leave_round(cp: _ControlPlane, r: FlowerRound, token: str) -> None:
    """Tell the control plane that the client leaves round ``r`` (its training raised)."""
    try:
        report_failure(
            cp.url, cp.job, r.round, cp.client_id, r.error or "failed", token, ca_file=cp.ca_file
        )
    except ClientError as exc:  # the round ended meanwhile: there is nothing left to leave
        log.warning("%s: round %d failure not recorded: %s", cp.client_id, r.round, exc)


def _follow_resends(cp: _ControlPlane, r: FlowerRound, resend: int, token: str) -> int:
    """Until the round ends: when the control plane asks for the update again (its root node
    died and another took the job over), send the same update to the node it names."""
    sent = 0
    while True:
        view = cp.job_view()
        cur = view.get("round") or {}
        if view.get("done") or int(cur.get("number") or 0) != r.round or cur.get("state") != "open":
            return sent
        a = cp.assignment()
        if a is not None and int(a["round"]) == r.round and int(a.get("resend") or 0) > resend:
            resend = int(a["resend"])
            with cp.gateway(str(a["gateway_url"]), token, a.get("tls_name") or None) as fl:
                fl.upload(r.round, r.weights, r.fit_examples, meta=r.meta)
            sent += 1
        time.sleep(0.1)


class _ControlPlane:
    """The two calls a client makes on the control plane, with its own token; a control
    plane that restarts (refused connection, 5xx) is asked again for up to ``down_s``."""

    def __init__(
        self,
        url: str,
        job: str,
        client_id: str,
        token: str,
        down_s: float = 30,
        ca_file: CaFile = None,
    ) -> None:
        self.url, self.job, self.client_id, self.down_s = url, job, client_id, down_s
        self.ca_file = ca_file
        self.http = httpx.Client(
            base_url=url.rstrip("/"),
            headers={"Authorization": f"Bearer {token}"},
            timeout=30,
            verify=verify_for(ca_file),
        )

    def gateway(self, url: str, token: str, tls_name: str | None = None) -> FLClient:
        """This client's connection to the gateway at ``url`` (trusting the same CA; its
        certificate verified against ``tls_name`` where the assignment gives one)."""
        return FLClient(
            url, self.job, self.client_id, token, ca_file=self.ca_file, tls_name=tls_name
        )

    def close(self) -> None:
        self.http.close()

    def _get(self, path: str, **params: str) -> httpx.Response:
        until = time.monotonic() + self.down_s
        while True:
            try:
                r = self.http.get(path, params=params)
                if r.status_code < 500:
                    return r
                why = f"HTTP {r.status_code}"
            except httpx.TransportError as exc:
                why = repr(exc)
            if time.monotonic() > until:
                raise GatewayUnavailable(0, "unreachable", why, method="GET", url=path)
            time.sleep(0.5)

    def job_view(self) -> dict[str, Any]:
        r = self._get(f"/v1/jobs/{self.job}", client=self.client_id)  # whose token it is
        raise_for(r)
        body: dict[str, Any] = r.json()
        if body.get("failed"):
            raise JobFailed.of(self.job, str(body["failed"]))
        return body

    def assignment(self) -> dict[str, Any] | None:
        """This client's place in the open round, or None when it is not in it."""
        r = self._get(f"/v1/jobs/{self.job}/assignment", client=self.client_id)
        if r.status_code >= 400:
            err = from_response(r)
            if isinstance(err, ClientNotSelected) or err.error == "round_state":
                return None
            raise err
        body: dict[str, Any] = r.json()
        return None if body.get("done") else body  # the job ended meanwhile
