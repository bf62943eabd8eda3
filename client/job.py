"""A job as its owner holds it, from submission to the final model (:class:`Job`).

::

    job = submit_job(CONTROL_PLANE, "mine", weights, rounds=2, goal=6, admin_token=secret,
                     tracker_url=TRACKER, analyst_token=analyst)
    job.enroll(["c0", "c1", ...])               # each client's token, kept by the handle
    with job.client("c0", round=1) as fl:       # waits for round 1; c0's gateway and token
        fl.upload(1, train(fl.wait_for_version(0).data), num_samples=120)
    job.wait()                                  # every round ended
    job.model()                                 # the final model, from the node holding it
    job.history()                               # each round: state, updates, failures...
    job.query("shapley", rounds=[2])            # FLStore's answer

A client whose ``with job.client(...)`` block raises before its upload was accepted tells the
control plane that it leaves the round (:meth:`Job.report_failure`): the round goes on with
the others under the job's ``min_updates`` instead of waiting for its deadline.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from client.control import call, enroll, report_failure
from client.errors import (
    ClientError,
    ClientNotSelected,
    GatewayUnavailable,
    JobFailed,
    NotFound,
    StaleRound,
)
from client.flstore import flstore_query
from client.node import FLClient, GlobalModel, UploadReceipt
from client.tls import CaFile

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Assignment:
    """Where a client uploads its update of ``round`` (``GET /v1/jobs/{job}/assignment``).

    ``resend`` grows when the client's accepted update was lost with a dead root node: it
    sends the update again, to ``gateway_url``. ``done``: the job has ended, and
    ``gateway_url`` is the node holding the final model (``round`` is the last round).
    """

    job: str
    round: int
    client: str
    node: str
    gateway_url: str
    resend: int = 0
    done: bool = False
    #: the name ``gateway_url``'s certificate is verified against where not its host (a
    #: gateway the control plane found through discovery: its node), else None
    tls_name: str | None = None


class RoundClient(FLClient):
    """A client's connection to its gateway for one round of a job (:meth:`Job.client`).

    Leaving its ``with`` block by an exception before an upload of the round was accepted
    reports the failure to the control plane: the client leaves the round, which goes on
    without it (the exception still propagates).
    """

    def __init__(self, job: Job, assignment: Assignment, token: str) -> None:
        super().__init__(
            assignment.gateway_url,
            job.name,
            assignment.client,
            token,
            timeout=job.timeout,
            transport=job.transport,
            ca_file=job.ca_file,
            tls_name=assignment.tls_name,
        )
        self.assignment = assignment
        self.round = assignment.round
        self._job = job
        self._uploaded = False

    def upload(self, round: int, *args: Any, **kw: Any) -> UploadReceipt:
        """:meth:`FLClient.upload`, remembering that the round's update was accepted."""
        receipt = super().upload(round, *args, **kw)
        self._uploaded = self._uploaded or int(round) == self.round
        return receipt

    def __enter__(self) -> RoundClient:
        return self

    def __exit__(self, *info: object) -> None:
        exc = info[1] if len(info) > 1 else None
        try:
            if isinstance(exc, Exception) and not self._uploaded and not self.assignment.done:
                try:
                    self._job.report_failure(self.client_id, self.round, exc)
                except ClientError as err:  # the round moved on meanwhile: nothing to leave
                    log.warning(
                        "%s: round %d failure not recorded: %s", self.client_id, self.round, err
                    )
        finally:
            self.close()


class Job(Mapping[str, Any]):
    """The handle of a job on the control plane (from :func:`client.submit.submit_job` or
    :func:`client.submit.attach_job`).

    It reads as the control plane's answer to the job's creation, so ``job["tokens"]``,
    ``job["enrollment_token"]`` and ``job["round"]`` work as they did on the plain answer.
    Its methods use the admin token, and a client's own token (from the creation answer or
    :meth:`enroll`) for what that client does.

    Parameters
    ----------
    control_plane_url : e.g. ``http://127.0.0.1:8070``.
    name : the job's name.
    admin_token : the control plane's admin token.
    created : the control plane's answer to the job's creation (or its view).
    tracker_url, analyst_token : FLStore's request tracker and a token it takes, for
        :meth:`query`.
    timeout : seconds for each request.
    transport : optional httpx transport (tests).
    ca_file : the platform's CA certificate, for ``https://`` URLs (:mod:`client.tls`): the
        control plane's, the gateways' it names and the tracker's.
    """

    def __init__(
        self,
        control_plane_url: str,
        name: str,
        admin_token: str,
        *,
        created: Mapping[str, Any] | None = None,
        tracker_url: str | None = None,
        analyst_token: str | None = None,
        timeout: float = 60.0,
        transport: httpx.BaseTransport | None = None,
        ca_file: CaFile = None,
    ) -> None:
        self.url = control_plane_url.rstrip("/")
        self.name = name
        self.created: dict[str, Any] = dict(created or {})
        #: client id -> its bearer token (enrolled at creation or by :meth:`enroll`)
        self.tokens: dict[str, str] = {
            str(k): str(v) for k, v in (self.created.get("tokens") or {}).items()
        }
        self.enrollment_token: str | None = self.created.get("enrollment_token")
        self.tracker_url = tracker_url
        self.timeout = timeout
        self.transport = transport
        self.ca_file = ca_file
        self._admin = admin_token
        self._analyst = analyst_token

    # -- the creation answer, as a mapping ----------------------------------------------------
    def __getitem__(self, key: str) -> Any:
        return self.created[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.created)

    def __len__(self) -> int:
        return len(self.created)

    def __repr__(self) -> str:
        return f"Job({self.name!r} on {self.url})"

    # -- calls --------------------------------------------------------------------------------
    def _get(self, path: str, token: str | None = None, **params: str) -> Any:
        resp = call(
            "GET",
            self.url,
            path,
            token or self._admin,
            timeout=self.timeout,
            transport=self.transport,
            ca_file=self.ca_file,
            params=params,
        )
        return resp.json()

    def view(self) -> dict[str, Any]:
        """The control plane's view of the job (``GET /v1/jobs/{job}``): its current round,
        ``completed``, ``done``, ``failed``, ``root``, ``history``, ``totals``, ..."""
        out: dict[str, Any] = self._get(f"/v1/jobs/{self.name}")
        return out

    def _alive_view(self) -> dict[str, Any]:
        """:meth:`view`, raising :class:`JobFailed` for a failed job."""
        view = self.view()
        if view.get("failed"):
            raise JobFailed.of(
                self.name, str(view["failed"]), url=f"{self.url}/v1/jobs/{self.name}"
            )
        return view

    def token_of(self, client: str) -> str:
        """``client``'s bearer token (``ValueError`` when the handle has none: enroll it)."""
        try:
            return self.tokens[client]
        except KeyError:
            raise ValueError(
                f"no token for client {client!r} of job {self.name!r}: enroll it first "
                "(job.enroll([...]))"
            ) from None

    def enroll(self, clients: Sequence[str]) -> dict[str, str]:
        """Enroll ``clients`` (``POST /v1/jobs/{job}/clients``) with the job's enrollment
        token (the admin's for a job taken up with :func:`~client.submit.attach_job`); returns
        their tokens, which the handle keeps. Round 1 opens once ``goal`` clients are in."""
        tokens = enroll(
            self.url,
            self.name,
            list(clients),
            self.enrollment_token or self._admin,
            timeout=self.timeout,
            transport=self.transport,
            ca_file=self.ca_file,
        )
        self.tokens.update(tokens)
        return tokens

    def assignment(
        self, client: str, *, round: int | None = None, timeout: float = 300.0
    ) -> Assignment:
        """Where ``client`` uploads its update of ``round`` (default: of the next round it is
        in), asked with its own token; waits up to ``timeout`` s for that round to open.

        Once the job has ended (and ``round`` is None), the answer is the node holding the
        final model (``done``). Raises :class:`~client.errors.ClientNotSelected` when the
        round opened without the client, :class:`~client.errors.StaleRound` when ``round``
        is over, :class:`~client.errors.JobFailed` when the job failed and ``TimeoutError``
        when the round did not open in time.
        """
        token = self.tokens.get(client, self._admin)
        deadline = time.monotonic() + timeout
        delay = 0.05
        refused: ClientNotSelected | None = None
        while True:
            view = self._polled(deadline)
            cur = view.get("round") or {}
            number, state = int(cur.get("number") or 0), cur.get("state")
            if round is not None and (number > round or view.get("done")):
                raise StaleRound(
                    409,
                    "stale_round",
                    f"round {round} of job {self.name!r} is over (the job is at round "
                    f"{number}, {state}{', done' if view.get('done') else ''})",
                )
            if view.get("done") or (state == "open" and (round is None or number == round)):
                try:
                    a = self._get(f"/v1/jobs/{self.name}/assignment", token, client=client)
                except ClientNotSelected as exc:
                    # not in this round (round None: wait for one it is in), or the round
                    # closed between the two calls: the next view tells which
                    if round is not None and refused is not None:
                        raise
                    refused = exc
                else:
                    return Assignment(
                        job=self.name,
                        round=int(a["round"]),
                        client=client,
                        node=str(a["node"]),
                        gateway_url=str(a["gateway_url"]),
                        resend=int(a.get("resend") or 0),
                        done=bool(a.get("done")),
                        tls_name=str(a["tls_name"]) if a.get("tls_name") else None,
                    )
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"round {round if round is not None else number + 1} of job {self.name!r} "
                    f"did not open for {client!r} in {timeout:.0f} s (now: {number} {state})"
                )
            time.sleep(delay)
            delay = min(delay * 1.5, 0.5)

    def client(
        self, client: str, *, round: int | None = None, timeout: float = 300.0
    ) -> RoundClient:
        """``client``'s connection to its gateway for ``round`` (:meth:`assignment`), with
        its own token; use it in a ``with`` block (see :class:`RoundClient`)."""
        token = self.token_of(client)
        return RoundClient(self, self.assignment(client, round=round, timeout=timeout), token)

    def report_failure(self, client: str, round: int, error: BaseException | str) -> dict[str, Any]:
        """Tell the control plane that ``client`` leaves ``round`` without an update, its
        training having raised ``error`` (:func:`client.control.report_failure`)."""
        return report_failure(
            self.url,
            self.name,
            round,
            client,
            error,
            self.tokens.get(client, self._admin),
            timeout=self.timeout,
            transport=self.transport,
            ca_file=self.ca_file,
        )

    def wait(self, round: int | None = None, *, timeout: float = 600.0) -> dict[str, Any]:
        """Until ``round`` has ended (its model published), or with None until the job has:
        returns the round's record in :meth:`history`, or the job's final view.

        Raises :class:`~client.errors.JobFailed` when the job failed and ``TimeoutError``
        after ``timeout`` s. A control plane that restarts meanwhile is asked again.
        """
        deadline = time.monotonic() + timeout
        delay = 0.05
        while True:
            view = self._polled(deadline)
            if round is None and view.get("done"):
                return view
            for rec in view.get("history") or ():
                if round is not None and int(rec.get("round", 0)) == round:
                    return dict(rec)
            if round is not None and view.get("done"):
                raise NotFound(
                    404, "not_found", f"job {self.name!r} has no round {round} in its history"
                )
            if time.monotonic() > deadline:
                what = "the job" if round is None else f"round {round}"
                raise TimeoutError(f"{what} of {self.name!r} not ended after {timeout:.0f} s")
            time.sleep(delay)
            delay = min(delay * 1.5, 0.5)

    def _polled(self, deadline: float) -> dict[str, Any]:
        """:meth:`_alive_view`, asking again while the control plane is unreachable (it may
        restart) until ``deadline``."""
        while True:
            try:
                return self._alive_view()
            except GatewayUnavailable:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    def history(self) -> list[dict[str, Any]]:
        """The job's ended rounds, oldest first (the newest 100): each one's ``state``
        (``closed``, ``expired``, ``failed``), ``received`` and ``aggregated`` updates,
        ``closing`` (why it closed early), ``failures`` (client -> its error), ..."""
        return list(self.view().get("history") or [])

    def model(self, *, version: int | None = None, timeout: float = 120.0) -> GlobalModel:
        """The job's global model, from its root node (the node that publishes it), also
        after the job ended; the final model once :meth:`wait` returned. With ``version``,
        waits until that version (or a newer one) is published.

        Another node of the job is asked when the root node does not answer (each serves
        the model it fetched from the root).
        """
        view = self.view()
        nodes = self._get("/v1/nodes")["nodes"]
        order = [n for n in nodes if n["name"] == view.get("root")]
        order += [n for n in nodes if n["name"] != view.get("root") and n.get("healthy")]
        last: ClientError | None = None
        for node in order:
            url = node["url"]
            with FLClient(
                url,
                self.name,
                "",
                self._admin,
                timeout=self.timeout,
                transport=self.transport,
                ca_file=self.ca_file,
                tls_name=node.get("tls_name") or None,
            ) as fl:
                try:
                    if version is None:
                        return fl.fetch_model()
                    return fl.wait_for_version(version, timeout=timeout)
                except (GatewayUnavailable, NotFound) as exc:
                    log.info("job %s: no model from %s: %s", self.name, url, exc)
                    last = exc
        if last is not None:
            raise last
        raise GatewayUnavailable(
            503, "no_healthy_nodes", f"the control plane names no node of job {self.name!r}"
        )

    def query(
        self,
        workload: str,
        *,
        rounds: list[int] | None = None,
        clients: list[str] | None = None,
        params: Mapping[str, Any] | None = None,
        wait: float = 120.0,
    ) -> dict[str, Any]:
        """Ask FLStore about the job (:func:`client.flstore.flstore_query`), e.g.
        ``job.query("shapley", rounds=[2], params={"method": "gtg"})``; returns the finished
        query, its answer in ``result``. Needs ``tracker_url`` and ``analyst_token``."""
        if not self.tracker_url or not self._analyst:
            raise ValueError(
                "asking FLStore needs the tracker: pass tracker_url and analyst_token to "
                "submit_job (or attach_job)"
            )
        return flstore_query(
            self.tracker_url,
            workload,
            self.name,
            rounds=rounds,
            clients=clients,
            params=params,
            token=self._analyst,
            wait=wait,
            transport=self.transport,
            ca_file=self.ca_file,
        )
