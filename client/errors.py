"""Typed errors of the client SDK: every call raises a :class:`ClientError` subclass.

Each error names the HTTP ``status`` (0 when no answer came), the server's ``error`` code and
its ``detail``, the request (``method``, ``url``) and the JSON body's other fields (``facts``,
e.g. a refused query's ``missing`` objects). Each code the platform's services answer
(the node gateways, the control plane, FLStore's request tracker, cache engine and cache
functions) maps to one class, listed in its ``codes``; a code the SDK does not know falls
back by status (:func:`error_for`). Catch the family you can act on::

    try:
        fl.upload(rnd, weights, num_samples=n)
    except StaleRound:          # the round moved on: train on the next one
        ...
    except GatewayUnavailable:  # not reached, or busy (``retry_after``): try again later
        ...

The hierarchy::

    ClientError
    +-- GatewayUnavailable        5xx, or no answer (error "unreachable")
    +-- UpdateRejected            every 4xx: the request itself was refused
    |   +-- InvalidRequest        400/422: a malformed request or job
    |   +-- InvalidQuery          a query FLStore cannot run as asked
    |   +-- Unauthorized          401/403: missing, wrong or revoked credential
    |   |   +-- ClientRevoked, ClientExcluded
    |   +-- NotFound              404
    |   |   +-- JobNotFound, RoundNotWritten
    |   +-- Conflict              409: the platform's state does not allow it now
    |       +-- StaleRound        the round is not the one open for this client
    |       |   +-- ClientNotSelected
    |       +-- JobFailed, PrivacyBudgetSpent, MissingData
    +-- QueryFailed               mixed into whatever FLStore's tracker answered
                                  (:func:`query_error`)
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, ClassVar, cast

import httpx

#: ``error`` of a request that got no answer (refused or broken connection, timeout)
UNREACHABLE = "unreachable"


class ClientError(Exception):
    """Base class of every error the SDK raises.

    Parameters
    ----------
    status : the HTTP status of the answer; 0 when none came.
    error : the server's error code (``"stale_round"``, ...), ``"http_<status>"`` for an
        answer without one, ``"unreachable"`` when no answer came.
    detail : what was wrong and how to fix it, as the server said.
    method, url : the request.
    facts : the other fields of the answer's JSON body (e.g. ``missing``, ``errors``).
    retry_after : the seconds a 503 asked the client to wait (its ``Retry-After``), else None.
    """

    #: the server error codes this class stands for (see :data:`CODES`)
    codes: ClassVar[tuple[str, ...]] = ()

    def __init__(
        self,
        status: int,
        error: str,
        detail: str,
        *,
        method: str = "",
        url: str = "",
        facts: Mapping[str, Any] | None = None,
        retry_after: float | None = None,
    ) -> None:
        where = f"{method} {url} -> " if method or url else ""
        super().__init__(f"{where}{status} {error}: {detail}")
        self.status = status
        self.error = error
        self.detail = detail
        self.method = method
        self.url = url
        self.facts = dict(facts or {})
        self.retry_after = retry_after


class GatewayUnavailable(ClientError):
    """A platform service (node gateway, control plane, tracker) could not be reached or could
    not serve the request now (a 5xx): asking again later may work. ``retry_after`` is the
    wait a 503 asked for."""

    codes: ClassVar[tuple[str, ...]] = (
        UNREACHABLE,
        "internal",
        "memory_budget",
        "store_full",
        "journal_unavailable",
        "gateway_busy",
        "upload_in_flight",
        "no_peer",
        "checkpoints_unavailable",
        "http_version",
        "no_healthy_nodes",
        "gateway_error",
        "unavailable",
        "engine_unavailable",
        "functions_unavailable",
        "engine_error",
        "load_failed",
        "no_capacity",
        "capacity_exceeded",
        "cold_store",
        "evaluator_failed",
        "part_failed",
    )

    @property
    def reason(self) -> str:
        """Why, in one line: the status, code and detail."""
        return f"HTTP {self.status} {self.error}: {self.detail}"


class UpdateRejected(ClientError):
    """The platform refused the request (a 4xx); sending it again unchanged will not help.
    Its own codes are an upload's refusals (a body that is not the job's model)."""

    codes: ClassVar[tuple[str, ...]] = (
        "bad_update",
        "malformed_safetensors",
        "header_too_large",
        "spec_mismatch",
        "size_mismatch",
        "truncated_body",
        "non_finite",
        "bad_header",
        "bad_content_length",
        "length_required",
        "body_too_large",
        "head_too_large",
        "bad_client_meta",
        "bad_sample_count",
    )


class InvalidRequest(UpdateRejected):
    """400/422: a malformed request, or a job the platform cannot run as specified."""

    codes: ClassVar[tuple[str, ...]] = (
        "bad_request",
        "bad_json",
        "invalid_input",
        "invalid_request",
        "control_plane_error",
        "bad_job",
        "bad_job_name",
        "bad_clients",
        "bad_aggregation",
        "bad_async",
        "bad_server_opt",
        "bad_server_opt_state",
        "bad_evaluator",
        "bad_plan",
        "bad_close",
        "bad_adopt",
        "bad_handoff",
        "bad_touch",
        "bad_weights",
        "body_with_resume",
    )


class SecureAggregationRefused(InvalidRequest):
    """400/422: a job's secure aggregation cannot work as asked, or a stage message of it is
    malformed (:mod:`client.secure`); the detail says which field and why."""

    codes: ClassVar[tuple[str, ...]] = (
        "bad_secure_aggregation",
        "bad_secagg_message",
        "bad_unmask",
    )


class InvalidQuery(UpdateRejected):
    """FLStore cannot run the query as asked: an unknown workload, parameters it refuses, or a
    job without the evaluator that the workload needs."""

    codes: ClassVar[tuple[str, ...]] = (
        "bad_query",
        "invalid_params",
        "unknown_workload",
        "workload_error",
        "no_evaluator",
    )


class Unauthorized(UpdateRejected):
    """401/403: a missing or wrong token, or one whose scope may not do this; or a route only
    the platform's own parts may call, asked without their client certificate over TLS
    (``client_certificate_required``, :mod:`gateway.callers`)."""

    codes: ClassVar[tuple[str, ...]] = ("unauthorized", "forbidden", "client_certificate_required")


class ClientRevoked(Unauthorized):
    """403: the client was revoked from the job, or left it; its token is refused."""

    codes: ClassVar[tuple[str, ...]] = ("client_revoked",)


class ClientExcluded(Unauthorized):
    """403: FLStore flagged the client (``drop_flagged``); later rounds refuse its uploads."""

    codes: ClassVar[tuple[str, ...]] = ("client_excluded",)


class NotFound(UpdateRejected):
    """404: the service does not know what the request names."""

    codes: ClassVar[tuple[str, ...]] = (
        "not_found",
        "no_route",
        "unknown_client",
        "unknown_query",
        "object_missing",
    )


class JobNotFound(NotFound):
    """404: the service does not know the job."""

    codes: ClassVar[tuple[str, ...]] = ("unknown_job", "no_checkpoint")


class RoundNotWritten(NotFound):
    """404: FLStore has not ingested that round (yet: the gateways tell it just after they
    publish the round's model)."""

    codes: ClassVar[tuple[str, ...]] = ("round_not_written",)


class Conflict(UpdateRejected):
    """409: the platform's state does not allow the request now."""

    codes: ClassVar[tuple[str, ...]] = (
        "job_exists",
        "job_being_deleted",
        "too_few_clients",
        "plan_conflict",
        "not_root",
        "model_lost",
        "no_checkpoints",
        "unknown_slot",
    )


class StaleRound(Conflict):
    """409: the round named is not the one open for this client (stale, future, full, closed,
    finished, another node's), or the client's update of it is there already."""

    codes: ClassVar[tuple[str, ...]] = (
        "stale_round",
        "future_round",
        "round_not_open",
        "round_closed",
        "round_full",
        "round_state",
        "duplicate_client",
        "too_stale",
        "job_finished",
        "wrong_node",
    )


class ClientNotSelected(StaleRound):
    """409: the client is not in the open round (or no round is open): ask again when the next
    one opens."""

    codes: ClassVar[tuple[str, ...]] = ("client_not_selected",)


class MissingData(Conflict):
    """409: the data a query needs is not there (a round, client, global model or metadata
    field), not held where asked, or inconsistent."""

    codes: ClassVar[tuple[str, ...]] = ("missing_data", "data_mismatch", "not_held")


class PrivacyBudgetSpent(Conflict):
    """409: a DP-FedAvg job ended before a round that would pass its privacy budget."""

    codes: ClassVar[tuple[str, ...]] = ("privacy_budget_spent",)


_FAILED = re.compile(r"^job '(?P<job>[^']*)' failed: (?P<reason>.*)$", re.S)


class StageOpen(Conflict):
    """409: the secure-aggregation stage asked about has not closed yet: ask again."""

    codes: ClassVar[tuple[str, ...]] = ("stage_open",)


class StageClosed(Conflict):
    """409: the secure-aggregation stage closed without this client (it counts as dropped),
    the round's masked sum holds no vector of this client (``not_in_sum``: its update is in
    no model of the round), the round is not being unmasked, the job has no secure
    aggregation, or its round could not be unmasked (the detail says why)."""

    codes: ClassVar[tuple[str, ...]] = (
        "stage_closed",
        "not_in_sum",
        "round_not_unmasking",
        "not_masked",
        "unmask_failed",
    )


class JobFailed(Conflict):
    """409: the control plane failed the job (a round short of its minimum at its deadline, or
    no model after it closed); ``job`` and ``reason`` say which and why."""

    codes: ClassVar[tuple[str, ...]] = ("job_failed",)

    @classmethod
    def of(cls, job: str, reason: str, *, url: str = "") -> JobFailed:
        """The error for a job whose view says it failed (its ``failed``)."""
        return cls(409, "job_failed", f"job {job!r} failed: {reason}", method="GET", url=url)

    @property
    def job(self) -> str:
        """The job's name."""
        m = _FAILED.match(self.detail)
        return m["job"] if m else ""

    @property
    def reason(self) -> str:
        """Why the job failed, as the control plane recorded it."""
        m = _FAILED.match(self.detail)
        return m["reason"] if m else self.detail


class QueryFailed(ClientError):
    """FLStore's request tracker refused or failed a query; ``query`` is what was asked.

    The error raised is also of the class of its code (:func:`query_error`): a query about a
    job FLStore does not know is a :class:`QueryFailed` and a :class:`JobNotFound`.
    """

    def __init__(self, *args: Any, query: Mapping[str, Any] | None = None, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.query = dict(query or {})


def _classes(root: type[ClientError]) -> list[type[ClientError]]:
    out = [root]
    for sub in root.__subclasses__():
        out += _classes(sub)
    return out


def _code_table() -> dict[str, type[ClientError]]:
    table: dict[str, type[ClientError]] = {}
    for cls in _classes(ClientError):
        if cls.__name__.startswith("_"):
            continue
        for code in cls.codes:
            if code in table:
                raise RuntimeError(f"{code!r} is a code of {table[code]} and {cls}")
            table[code] = cls
    return table


#: server error code -> the one class that stands for it
CODES: dict[str, type[ClientError]] = _code_table()


def class_for(status: int, error: str) -> type[ClientError]:
    """The class of an answer: its code's (:data:`CODES`), else by its status."""
    if error in CODES:
        return CODES[error]
    if status >= 500:
        return GatewayUnavailable
    if status in (401, 403):
        return Unauthorized
    if status == 404:
        return NotFound
    if status == 409:
        return Conflict
    if status in (400, 422):
        return InvalidRequest
    if status >= 400:
        return UpdateRejected
    return ClientError


def error_for(
    status: int,
    body: Any,
    *,
    text: str = "",
    method: str = "",
    url: str = "",
    retry_after: float | None = None,
    query: Mapping[str, Any] | None = None,
) -> ClientError:
    """The error for an answer of ``status`` whose JSON body is ``body`` (``{"error",
    "detail", ...}``; anything else is read as no code, with ``text`` as its detail). With
    ``query`` (what FLStore was asked) it is a :class:`QueryFailed` too."""
    fields = dict(body) if isinstance(body, dict) else {}
    error = str(fields.pop("error", "") or f"http_{status}")
    detail = str(fields.pop("detail", "") or text[:500])
    kw: dict[str, Any] = {"method": method, "url": url, "facts": fields, "retry_after": retry_after}
    cls = class_for(status, error)
    if query is None:
        return cls(status, error, detail, **kw)
    return query_error(cls)(status, error, detail, query=query, **kw)


def from_response(resp: httpx.Response, query: Mapping[str, Any] | None = None) -> ClientError:
    """The error for an httpx answer (see :func:`error_for`)."""
    try:
        body = resp.json()
    except ValueError:
        body = None
    raw = resp.headers.get("Retry-After", "")
    try:
        req: httpx.Request | None = resp.request
    except RuntimeError:  # an answer built without its request (tests' transports set one)
        req = None
    return error_for(
        resp.status_code,
        body,
        text=resp.text,
        method=req.method if req is not None else "",
        url=str(req.url) if req is not None else "",
        retry_after=float(raw) if raw.isdigit() else None,
        query=query,
    )


def raise_for(resp: httpx.Response) -> None:
    """Raise the answer's error unless it is a 1xx-3xx."""
    if resp.status_code >= 400:
        raise from_response(resp)


def unreachable(
    url: str, exc: BaseException, method: str = "", query: Mapping[str, Any] | None = None
) -> GatewayUnavailable:
    """The error of a request that got no answer (``exc``: httpx's transport error); with
    ``query``, a :class:`QueryFailed` too."""
    if query is None:
        return GatewayUnavailable(0, UNREACHABLE, repr(exc), method=method, url=url)
    cls = query_error(GatewayUnavailable)
    return cls(0, UNREACHABLE, repr(exc), method=method, url=url, query=query)  # type: ignore[return-value]


_QUERY_ERRORS: dict[type[ClientError], type[QueryFailed]] = {}


def query_error(cls: type[ClientError]) -> type[QueryFailed]:
    """``cls`` made a :class:`QueryFailed` too: what a refused query raises, so that callers
    may catch either the code's class or every query failure (one such class per ``cls``)."""
    if issubclass(cls, QueryFailed):
        return cls
    if cls not in _QUERY_ERRORS:
        both = type(cls.__name__, (cls, QueryFailed), {"__doc__": cls.__doc__})
        _QUERY_ERRORS.setdefault(cls, cast(type[QueryFailed], both))  # one, also across threads
    return _QUERY_ERRORS[cls]
