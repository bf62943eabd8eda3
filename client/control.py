"""The control plane's client: one call with a token (:func:`call`), enrollment, leaving, a
client's failure in a round, and the job metadata that travels in the initial weights.

The job's owner holds a job through :class:`client.job.Job` (from :func:`client.job.submit_job`);
these are the calls it and the clients make.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from typing import Any

import httpx

from client.errors import raise_for, unreachable
from client.tls import CaFile, verify_for

#: the longest failure text a client sends (the control plane keeps as much)
MAX_FAILURE_TEXT = 2000


def call(
    method: str,
    base_url: str,
    path: str,
    token: str,
    *,
    timeout: float = 60.0,
    transport: httpx.BaseTransport | None = None,
    ca_file: CaFile = None,
    **kw: Any,
) -> httpx.Response:
    """One call of the control plane with ``token`` (admin, enrollment or a client's own);
    its refusals raised as the SDK's typed errors (:mod:`client.errors`). ``ca_file``: the
    platform's CA for an ``https://`` URL (:mod:`client.tls`)."""
    url = base_url.rstrip("/") + path
    with httpx.Client(timeout=timeout, transport=transport, verify=verify_for(ca_file)) as http:
        try:
            resp = http.request(method, url, headers={"Authorization": f"Bearer {token}"}, **kw)
        except httpx.TransportError as exc:
            raise unreachable(url, exc, method) from exc
    raise_for(resp)
    return resp


#: The safetensors ``__metadata__`` entry through which a job declares its evaluator.
EVALUATOR_KEY = "fedfaas.evaluator"
#: ... and its server optimizer (``core.server_opt.METADATA_KEY``).
SERVER_OPT_KEY = "core.server_opt"
#: ... and async mode (``core.fedbuff.METADATA_KEY``).
ASYNC_KEY = "fedfaas.async"
#: ... and its aggregation rule (``core.robust.METADATA_KEY``).
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


def enroll(
    control_plane_url: str,
    job: str,
    clients: list[str],
    token: str,
    *,
    timeout: float = 60.0,
    transport: httpx.BaseTransport | None = None,
    ca_file: CaFile = None,
) -> dict[str, str]:
    """Enroll ``clients`` in ``job`` (``POST /v1/jobs/{job}/clients``) with the job's
    enrollment token (``submit_job``'s answer, handed out by the job's owner) or the admin
    token; returns each client's bearer token. Enrolling again returns the same token."""
    resp = call(
        "POST",
        control_plane_url,
        f"/v1/jobs/{job}/clients",
        token,
        timeout=timeout,
        transport=transport,
        ca_file=ca_file,
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
    ca_file: CaFile = None,
) -> None:
    """Take ``client_id`` out of ``job`` with its own token: it is never selected again and
    its token is refused from then on (it cannot enroll again)."""
    call(
        "DELETE",
        control_plane_url,
        f"/v1/jobs/{job}/clients/{client_id}",
        token,
        timeout=timeout,
        transport=transport,
        ca_file=ca_file,
        params={"client": client_id},
    )


def report_failure(
    control_plane_url: str,
    job: str,
    round: int,
    client_id: str,
    error: BaseException | str,
    token: str,
    *,
    timeout: float = 30.0,
    transport: httpx.BaseTransport | None = None,
    ca_file: CaFile = None,
) -> dict[str, Any]:
    """Tell the control plane that ``client_id`` leaves ``round`` of ``job`` without an update
    (its training raised ``error``): ``POST /v1/jobs/{job}/rounds/{round}/failures``, with the
    client's own token (or the admin's).

    The round stops waiting for it: it goes on with the updates of the others under the job's
    ``min_updates`` (as Flower's ``accept_failures``), closing as soon as they are in rather
    than at its deadline, or the job fails at once when too few can come. The client stays in
    the job and may be selected for later rounds. Send it only before the round's update was
    accepted (an accepted update counts).

    Returns
    -------
    dict
        ``{job, round, client, goal, expected, failures}``: the round's goal now, the
        updates it still expects at most, and every failure reported in it so far.
    """
    text = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
    resp = call(
        "POST",
        control_plane_url,
        f"/v1/jobs/{job}/rounds/{int(round)}/failures",
        token,
        timeout=timeout,
        transport=transport,
        ca_file=ca_file,
        params={"client": client_id},
        json={"client": client_id, "error": text[:MAX_FAILURE_TEXT]},
    )
    out: dict[str, Any] = resp.json()
    return out
