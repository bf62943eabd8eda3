"""Errors of the control plane: one base class, subclasses carry the facts.

Only the HTTP layer (``control_plane.api``) turns them into status codes.
"""

from __future__ import annotations


class ControlPlaneError(Exception):
    """Base class of every control-plane error.

    Attributes
    ----------
    code
        Short machine-readable code, used as ``error`` in HTTP answers.
    status
        The HTTP status the API answers with.
    """

    code = "control_plane_error"
    status = 400

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail

    def headers(self) -> dict[str, str]:
        """Extra headers of the HTTP answer (a 503's ``Retry-After``)."""
        return {}


class InvalidInput(ControlPlaneError):
    """An argument is out of range or malformed (sizes, capacities, goals, names)."""

    code = "invalid_input"
    status = 422


class UnknownJob(ControlPlaneError):
    """The job does not exist on this coordinator."""

    code = "unknown_job"
    status = 404

    def __init__(self, job: str) -> None:
        super().__init__(f"job {job!r} does not exist; create it with POST /v1/jobs first")
        self.job = job


class JobExists(ControlPlaneError):
    """A job of that name already exists."""

    code = "job_exists"
    status = 409

    def __init__(self, job: str) -> None:
        super().__init__(f"job {job!r} already exists; pick another name or DELETE it first")
        self.job = job


class JobBeingDeleted(ControlPlaneError):
    """A job of that name was deleted, but its root node, which still holds its journal, has
    not been told yet (it does not answer): the name is free once it has."""

    code = "job_being_deleted"
    status = 409

    def __init__(self, job: str, root: str) -> None:
        super().__init__(
            f"job {job!r} was deleted, but its root node {root} has not answered since and "
            "still holds it; create it again once that node is back (or pick another name)"
        )
        self.job, self.root = job, root


class ClientNotSelected(ControlPlaneError):
    """The client is not selected for the job's open round (or there is no open round)."""

    code = "client_not_selected"
    status = 409

    def __init__(self, job: str, client: str, round_: int | None) -> None:
        where = f"round {round_}" if round_ is not None else "any open round"
        super().__init__(
            f"client {client!r} is not selected for {where} of job {job!r}; "
            "ask again when the next round opens"
        )
        self.job, self.client, self.round = job, client, round_


class RoundStateError(ControlPlaneError):
    """The requested round transition is not allowed in the round's current state."""

    code = "round_state"
    status = 409


class PrivacyBudgetSpent(RoundStateError):
    """A DP-FedAvg job's next round would spend more than its privacy budget: the job ends
    instead (its view's ``stopped`` says so)."""

    code = "privacy_budget_spent"


class NoHealthyNodes(ControlPlaneError):
    """Every node gateway is marked down; nothing can be placed."""

    code = "no_healthy_nodes"
    status = 503

    def __init__(self) -> None:
        super().__init__(
            "no node gateway answers /healthz; start a gateway or pass --gateways with live URLs"
        )


class GatewayError(ControlPlaneError):
    """A node gateway answered with an error or could not be reached."""

    code = "gateway_error"
    status = 502

    def __init__(self, node: str, detail: str, *, error: str = "") -> None:
        super().__init__(f"node {node!r}: {detail}")
        self.node = node
        #: the gateway's own error code, when it answered one (e.g. ``model_lost``)
        self.error = error


class GatewayBusy(GatewayError):
    """A node gateway answered 503 with a ``Retry-After``: it cannot do it now (its object
    store full, ``error`` ``store_full``) and keeps nothing of the request; the caller sends it
    again after ``retry_after`` seconds, which the answer passes on."""

    code = "gateway_busy"
    status = 503

    def __init__(self, node: str, detail: str, *, error: str = "", retry_after: int = 1) -> None:
        super().__init__(node, f"{detail}; retry after {retry_after} s", error=error)
        self.retry_after = retry_after

    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.retry_after)}


class UnknownClient(ControlPlaneError):
    """The client is not one of the job's clients."""

    code = "unknown_client"
    status = 404

    def __init__(self, job: str, client: str) -> None:
        super().__init__(f"{client!r} is not a client of job {job!r}")
        self.job, self.client = job, client


class ClientRevoked(ControlPlaneError):
    """The client was revoked (``DELETE /v1/jobs/{job}/clients/{id}``)."""

    code = "client_revoked"
    status = 403

    def __init__(self, job: str, client: str) -> None:
        super().__init__(f"client {client!r} of job {job!r} was revoked")
        self.job, self.client = job, client


class TooFewClients(ControlPlaneError):
    """Revoking the client would leave fewer clients than the job's goal."""

    code = "too_few_clients"
    status = 409


class JobFailed(ControlPlaneError):
    """The job failed (a round short of its minimum at the deadline, or no model after it
    was closed); nothing more happens in it. ``reason`` says why."""

    code = "job_failed"
    status = 409

    def __init__(self, job: str, reason: str) -> None:
        super().__init__(f"job {job!r} failed: {reason}")
        self.job, self.reason = job, reason
