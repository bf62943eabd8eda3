"""What a client tells the control plane about its round, and where it finds the final model.

* ``POST /v1/jobs/{job}/rounds/{round}/failures?client=ID``, body ``{"client": ID, "error":
  "..."}`` (the client's own token, or the admin's): the client leaves the open round without
  an update, because its training raised. The round stops waiting for it. If the updates it
  can still get meet the job's ``min_updates``, its goal drops to them, and the coordinator's
  poll closes it as soon as they are in, on the path a round takes at its goal: the gateways
  stop their intake and aggregate what they hold (:meth:`Coordinator._shrink_round`). So the
  round does not wait for its deadline, as Flower's ``accept_failures`` goes on with the
  results it has. If they cannot meet the minimum, waiting would change nothing: the job
  fails at once (:meth:`Coordinator._fail`: no gateway is left waiting). The round's view
  (and its history record) names each failed client with its error; the client stays in the
  job and may be selected for later rounds.
* :func:`final_assignment`: once every round ended, a client asking where to go
  (``GET /v1/jobs/{job}/assignment``) is sent to the job's root node, which holds the final
  model, instead of hearing 409 ``client_not_selected``.
"""

from __future__ import annotations

import json
import logging
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Request

from control_plane.coordinator import Coordinator
from control_plane.errors import (
    ClientNotSelected,
    ClientRevoked,
    ControlPlaneError,
    InvalidInput,
    JobFailed,
    RoundStateError,
)
from core.auth import AuthError, Scope, require

log = logging.getLogger(__name__)

#: the largest failure body read (a client id and an error text)
MAX_BODY = 8192
#: the longest error text kept
MAX_ERROR = 2000


class BodyTooLarge(ControlPlaneError):
    """The request body is larger than the route reads."""

    code = "body_too_large"
    status = 413


def _coordinator(request: Request) -> Coordinator:
    coord: Coordinator = request.app.state.coordinator
    return coord


def add_routes(app: FastAPI) -> None:
    """Serve this module's routes on the control plane's ``app``."""
    app.add_api_route("/v1/jobs/{job}/rounds/{number}/failures", round_failure, methods=["POST"])


async def round_failure(
    scope: Annotated[Scope, Depends(require(Scope.CLIENT))],  # first: before the body is read
    job: str,
    number: int,
    request: Request,
) -> dict[str, Any]:
    """A client leaves round ``number`` without an update: its training failed."""
    client, error = await _failure_body(request)
    if scope is Scope.CLIENT and request.query_params.get("client") != client:
        raise AuthError(403, "a client may only report its own failure (?client= and the body's)")
    return await report_failure(_coordinator(request), job, number, client, error)


async def read_json(request: Request, limit: int) -> Any:
    """The JSON body, read only up to ``limit`` bytes (413 past it); None when it is no JSON."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge(f"the body has {declared} bytes; at most {limit} are read")
    raw = b""
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > limit:
            raise BodyTooLarge(f"the body is over {limit} bytes")
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):
        return None


async def _failure_body(request: Request) -> tuple[str, str]:
    """``(client, error)`` of the body, read only up to :data:`MAX_BODY` bytes."""
    body = await read_json(request, MAX_BODY)
    client = body.get("client") if isinstance(body, dict) else None
    error = body.get("error", "") if isinstance(body, dict) else None
    if not isinstance(client, str) or not client or not isinstance(error, str):
        raise InvalidInput('body must be JSON {"client": "<id>", "error": "<what failed>"}')
    if len(error) > MAX_ERROR:
        raise InvalidInput(f"error must be at most {MAX_ERROR} characters, not {len(error)}")
    return client, error


async def report_failure(
    coord: Coordinator, name: str, number: int, client: str, error: str
) -> dict[str, Any]:
    """Record that ``client`` leaves the open round ``number`` of job ``name`` without an
    update; lower the round's goal to the updates it can still get, or fail the job when
    they cannot meet its ``min_updates`` (see the module's docstring).

    Raises :class:`JobFailed` for a failed job, :class:`RoundStateError` when ``number`` is
    not the open round or its gateways were told to close it already (its updates are
    fixed), :class:`ClientRevoked` and :class:`ClientNotSelected` for a client not in it.
    """
    async with coord.job_lock(name):  # the job's round state changes only under its lock
        job = coord.job(name)
        if job.failed:
            raise JobFailed(name, job.failed)
        if client in job.revoked:
            raise ClientRevoked(name, client)
        rnd = job.current
        if rnd is None or rnd.number != number or rnd.state not in ("open", "aggregating"):
            now = "none" if rnd is None else f"{rnd.number} ({rnd.state})"
            raise RoundStateError(f"round {number} of {name!r} is not open; its round: {now}")
        if client not in rnd.selected:
            raise ClientNotSelected(name, client, number)
        if rnd.closing is not None:
            raise RoundStateError(
                f"round {number} of {name!r} is closing ({rnd.closing}) with the updates its "
                "gateways hold; a failure no longer changes it"
            )
        rnd.failures[client] = error
        expected = [c for c in rnd.selected if c not in job.revoked and c not in rnd.failures]
        least = min(job.spec.min_updates, rnd.goal)
        log.warning(
            "job %s round %d: client %s failed (%s); %d update(s) can still come, %d needed",
            name,
            number,
            client,
            error[:200],
            len(expected),
            least,
        )
        if len(expected) < least:
            await coord._fail(
                job,
                f"round {number}: {len(rnd.failures)} selected client(s) failed "
                f"({', '.join(sorted(rnd.failures))}); at most {len(expected)} of its minimum "
                f"{least} update(s) can arrive",
            )
        else:
            rnd.goal = min(rnd.goal, len(expected))  # the poll closes the round at this goal
        await coord._save(job)
        return {
            "job": name,
            "round": number,
            "client": client,
            "goal": rnd.goal,
            "expected": len(expected),
            "failures": dict(rnd.failures),
            "failed": job.failed or None,
        }


def final_assignment(coord: Coordinator, name: str, client: str) -> dict[str, Any] | None:
    """The assignment's answer once every round of the job ended: the job's root node, which
    holds the final model (``done`` true). None while the job runs, and for a failed or
    stopped job or a revoked client (the usual answer's errors say so)."""
    job = coord.job(name)
    if not job.done or job.failed or job.stopped or client in job.revoked:
        return None
    h = coord.nodes.get(job.root)
    if h is None:
        return None
    return {
        "job": name,
        "round": job.completed,
        "client": client,
        "node": h.name,
        "gateway_url": h.url,
        "tls_name": h.tls_name,
        "resend": 0,
        "done": True,
    }
